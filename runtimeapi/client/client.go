// Package client reads volume-agent's runtime API (package runtimeapi)
// over its unix socket: the pods on the node, one pod's volumes and
// container mounts, and a wait until a pod's volumes are ready.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/volume-agent/volume-agent/runtimeapi"
)

// Client talks to one agent. It is safe for concurrent use.
type Client struct {
	http *http.Client
}

// New returns a client of the agent serving the socket at path
// (runtimeapi.Socket(rootDir)).
func New(socket string) *Client {
	return &Client{http: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return runtimeapi.Dial(ctx, socket)
		},
		MaxIdleConns:    4,
		IdleConnTimeout: 30 * time.Second,
	}}}
}

// Error is an error response of the API.
type Error struct {
	StatusCode int
	// Code is one of runtimeapi's Code* constants.
	Code    string
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("runtime API: %s (%d %s)", e.Message, e.StatusCode, e.Code)
}

// IsNotFound reports whether err says the pod is not on this node.
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == runtimeapi.CodePodNotFound
}

// NotReadyError is what Wait returns when the timeout passed before the
// pod's volumes were ready: like the kubelet's WaitForAttachAndMount
// error, it names the volumes that are not ready and why.
type NotReadyError struct {
	Pod *runtimeapi.Pod
}

func (e *NotReadyError) Error() string {
	return fmt.Sprintf("pod %s/%s: %s", e.Pod.Namespace, e.Pod.Name, e.Pod.Message)
}

// NotReady lists the volumes that are not ready.
func (e *NotReadyError) NotReady() []runtimeapi.Volume {
	var out []runtimeapi.Volume
	for _, v := range e.Pod.Volumes {
		if !v.Ready {
			out = append(out, v)
		}
	}
	return out
}

// Pods lists the pods on the node the agent manages.
func (c *Client) Pods(ctx context.Context) (*runtimeapi.PodList, error) {
	var out runtimeapi.PodList
	return &out, c.get(ctx, "/"+runtimeapi.Version+"/pods", &out)
}

// Pod returns a pod's volumes and container mounts as they are now
// (Ready may be false).
func (c *Client) Pod(ctx context.Context, uid string) (*runtimeapi.Pod, error) {
	var out runtimeapi.Pod
	return &out, c.get(ctx, "/"+runtimeapi.Version+"/pods/"+url.PathEscape(uid), &out)
}

// Wait waits up to timeout (at most the server's MaxWait, 10m) for the
// pod's volumes to be ready and returns the pod. When the timeout passes
// first it returns the pod as it was then and a *NotReadyError; a pod that
// never appeared on the node gives an error IsNotFound recognises.
func (c *Client) Wait(ctx context.Context, uid string, timeout time.Duration) (*runtimeapi.Pod, error) {
	var out runtimeapi.Pod
	q := url.Values{"timeout": {timeout.String()}}
	if err := c.get(ctx, "/"+runtimeapi.Version+"/pods/"+url.PathEscape(uid)+"/wait?"+q.Encode(), &out); err != nil {
		return nil, err
	}
	if !out.Ready {
		return &out, &NotReadyError{Pod: &out}
	}
	return &out, nil
}

func (c *Client) get(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://volume-agent"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("runtime API: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("runtime API: reading the response: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var doc runtimeapi.ErrorDocument
		if json.Unmarshal(body, &doc) != nil || doc.Error.Code == "" {
			doc.Error.Message = string(body)
		}
		return &Error{StatusCode: resp.StatusCode, Code: doc.Error.Code, Message: doc.Error.Message}
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("runtime API: decoding the response: %w", err)
	}
	return nil
}
