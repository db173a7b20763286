package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"
)

// auditPolicy records the metadata of every request once it has been
// answered. Watches additionally get a ResponseStarted event when they begin.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
`

// Audit stages as written by the apiserver.
const (
	StageResponseStarted  = "ResponseStarted"  // a watch has begun
	StageResponseComplete = "ResponseComplete" // a request has been answered
)

// AuditEvent is the part of an audit.k8s.io/v1 Event that tests look at.
type AuditEvent struct {
	AuditID    string `json:"auditID"` // the same for all events of one request
	Stage      string `json:"stage"`
	Verb       string `json:"verb"` // get, list, watch, create, update, patch, delete, ...
	RequestURI string `json:"requestURI"`
	UserAgent  string `json:"userAgent"`
	User       struct {
		Username string   `json:"username"`
		Groups   []string `json:"groups"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		APIGroup    string `json:"apiGroup"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	// Received is when the API server received the request.
	Received time.Time `json:"requestReceivedTimestamp"`
}

func (c *Cluster) auditLogPath() string { return c.path("audit.log") }

// AuditEvents returns every request the apiserver has logged so far,
// including those from before a restart. An event is written just after the
// response, so a test that counts requests should poll until the count it
// expects shows up.
func (c *Cluster) AuditEvents() ([]AuditEvent, error) {
	data, err := os.ReadFile(c.auditLogPath())
	if err != nil {
		return nil, err
	}
	// A last line without a newline may still be being written.
	if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
		data = data[:i]
	} else {
		data = nil
	}
	var events []AuditEvent
	for line := range bytes.Lines(data) {
		var e AuditEvent
		if err := json.Unmarshal(line, &e); err != nil {
			return nil, fmt.Errorf("%s: %w", c.auditLogPath(), err)
		}
		events = append(events, e)
	}
	return events, nil
}

// CountRequests counts the requests, including watches still open, whose
// user agent starts with userAgentPrefix and whose verb and resource match;
// an empty argument matches anything. client-go's default user agent is
// "<binary>/<version> (<os>/<arch>) kubernetes/<commit>".
func (c *Cluster) CountRequests(userAgentPrefix, verb, resource string) (int, error) {
	events, err := c.AuditEvents()
	if err != nil {
		return 0, err
	}
	seen := map[string]bool{} // a watch has two events
	for _, e := range events {
		if !strings.HasPrefix(e.UserAgent, userAgentPrefix) || (verb != "" && e.Verb != verb) {
			continue
		}
		if resource != "" && (e.ObjectRef == nil || e.ObjectRef.Resource != resource) {
			continue
		}
		seen[e.AuditID] = true
	}
	return len(seen), nil
}
