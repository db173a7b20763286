// Package client reads the operator page's model from an agent's debug
// endpoint (GET /debug/status and its streams): what `volume-agent status`
// and the tests use.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/volume-agent/volume-agent/ui/model"
)

// Client talks to one agent.
type Client struct {
	base string
	http *http.Client
	// idle is how long a stream may stay silent (the agent sends a
	// keep-alive every 20 s) before it counts as lost.
	idle time.Duration
}

// New returns a client of the agent whose debug endpoint is at address
// (host:port, or a URL).
func New(address string) *Client {
	base := address
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	return &Client{base: strings.TrimSuffix(base, "/"), http: &http.Client{}, idle: time.Minute}
}

// NotFoundError is a pod the agent does not know.
type NotFoundError struct{ Message string }

func (e *NotFoundError) Error() string { return e.Message }

// Page returns the node's page, narrowed by f.
func (c *Client) Page(ctx context.Context, f model.Filter) (*model.Page, error) {
	var p model.Page
	return &p, c.get(ctx, pagePath(f, false), &p)
}

// Pod returns the detail view of namespace/name; a *NotFoundError when the
// agent does not know the pod.
func (c *Client) Pod(ctx context.Context, namespace, name string) (*model.PodDetail, error) {
	var d model.PodDetail
	return &d, c.get(ctx, podPath(namespace, name, false), &d)
}

// WatchPage calls fn with the page now and after each change, until ctx
// ends, fn fails or the stream is lost.
func (c *Client) WatchPage(ctx context.Context, f model.Filter, fn func(*model.Page) error) error {
	return c.watch(ctx, pagePath(f, true), func(data []byte) error {
		var p model.Page
		if err := json.Unmarshal(data, &p); err != nil {
			return fmt.Errorf("decoding the page: %w", err)
		}
		return fn(&p)
	})
}

// WatchPod calls fn with the pod's detail view now and after each change;
// while the agent does not know the pod, fn gets a *NotFoundError.
func (c *Client) WatchPod(ctx context.Context, namespace, name string, fn func(*model.PodDetail, error) error) error {
	return c.watch(ctx, podPath(namespace, name, true), func(data []byte) error {
		var nf struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(data, &nf) == nil && nf.Error != "" {
			return fn(nil, &NotFoundError{Message: nf.Error})
		}
		var d model.PodDetail
		if err := json.Unmarshal(data, &d); err != nil {
			return fmt.Errorf("decoding the pod: %w", err)
		}
		return fn(&d, nil)
	})
}

func pagePath(f model.Filter, watch bool) string {
	q := url.Values{}
	for k, v := range map[string]string{"namespace": f.Namespace, "pod": f.Pod, "state": f.State} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if watch {
		q.Set("watch", "1")
	}
	if len(q) == 0 {
		return "/debug/status"
	}
	return "/debug/status?" + q.Encode()
}

func podPath(namespace, name string, watch bool) string {
	p := "/debug/status/pods/" + url.PathEscape(namespace) + "/" + url.PathEscape(name)
	if watch {
		p += "?watch=1"
	}
	return p
}

func (c *Client) get(ctx context.Context, path string, into any) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := c.do(ctx, path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		var nf struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(body, &nf) == nil && nf.Error != "" {
			return &NotFoundError{Message: nf.Error}
		}
		return fmt.Errorf("GET %s: %s (is this agent older than `volume-agent status`?)", path, resp.Status)
	default:
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, bytes.TrimSpace(body))
	}
	if err := json.Unmarshal(body, into); err != nil {
		return fmt.Errorf("decoding %s: %w", path, err)
	}
	return nil
}

func (c *Client) do(ctx context.Context, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the agent's debug endpoint at %s (is the agent running with this --debug-address? in a cluster, kubectl port-forward to its pod first): %w", c.base, err)
	}
	return resp, nil
}

// ErrStreamLost is returned by the watches when the stream ends or stays
// silent too long; calling again reconnects.
var ErrStreamLost = errors.New("the agent's stream ended")

// watch reads the server-sent events of path and calls fn with the data of
// each.
func (c *Client) watch(parent context.Context, path string, fn func([]byte) error) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	resp, err := c.do(ctx, path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, bytes.TrimSpace(body))
	}
	// A silent stream is a lost one: the agent sends keep-alives.
	idle := time.AfterFunc(c.idle, cancel)
	defer idle.Stop()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	var data []byte
	for sc.Scan() {
		idle.Reset(c.idle)
		line := sc.Bytes()
		switch {
		case len(line) == 0:
			if len(data) > 0 {
				if err := fn(data); err != nil {
					return err
				}
			}
			data = data[:0]
		case bytes.HasPrefix(line, []byte("data:")):
			if len(data) > 0 {
				data = append(data, '\n')
			}
			data = append(data, bytes.TrimPrefix(line[5:], []byte(" "))...)
		}
	}
	if err := parent.Err(); err != nil {
		return err
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%w: %v", ErrStreamLost, err)
	}
	return ErrStreamLost
}
