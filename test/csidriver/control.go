package csidriver

// The control API lets a test steer a driver that runs as a separate process
// (cmd/test-csi-driver --control-socket PATH). It is plain HTTP with JSON
// bodies on a unix socket:
//
//	GET    /calls          call counts by method
//	DELETE /calls          reset the call counts
//	GET    /faults         {"faults":[{"method","code","times"}],"hangs":[...],"hung":{"method":n}}
//	POST   /faults         {"method":"NodeStageVolume","code":"Internal","times":1}; code "OK" clears
//	DELETE /faults         clear faults, hangs and crash-after
//	POST   /hangs          {"method":"NodeStageVolume","hang":true}
//	POST   /crash-after    {"n":3}
//	GET    /volumes        the driver's volumes (VolumeInfo)
//	POST   /conditions     {"volumeID":"...","abnormal":true,"message":"..."}: the volume's
//	                       condition in NodeGetVolumeStats (with --volume-condition)
//
// ControlClient wraps it for Go tests.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
)

type faultJSON struct {
	Method string `json:"method"`
	Code   string `json:"code"`
	Times  int    `json:"times,omitempty"`
}

type faultsJSON struct {
	Faults []faultJSON `json:"faults"`
	Hangs  []string    `json:"hangs"`
	// Hung counts the calls waiting in a hang right now, by method.
	Hung map[string]int `json:"hung,omitempty"`
}

type hangJSON struct {
	Method string `json:"method"`
	Hang   bool   `json:"hang"`
}

type crashAfterJSON struct {
	N int `json:"n"`
}

type conditionJSON struct {
	VolumeID string `json:"volumeID"`
	Abnormal bool   `json:"abnormal"`
	Message  string `json:"message"`
}

func (d *Driver) controlHandler() http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any, err error) {
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if v == nil {
			v = struct{}{}
		}
		_ = json.NewEncoder(w).Encode(v)
	}
	decode := func(r *http.Request, v any) error {
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
		dec.DisallowUnknownFields()
		return dec.Decode(v)
	}

	mux.HandleFunc("GET /calls", func(w http.ResponseWriter, _ *http.Request) {
		reply(w, d.CallCounts(), nil)
	})
	mux.HandleFunc("DELETE /calls", func(w http.ResponseWriter, _ *http.Request) {
		d.ResetCallCounts()
		reply(w, nil, nil)
	})
	mux.HandleFunc("GET /faults", func(w http.ResponseWriter, _ *http.Request) {
		out := faultsJSON{Faults: []faultJSON{}, Hangs: d.Hangs(), Hung: map[string]int{}}
		for _, m := range d.Hangs() {
			out.Hung[m] = d.HungCalls(m)
		}
		for _, f := range d.Faults() {
			out.Faults = append(out.Faults, faultJSON{Method: f.Method, Code: f.Code.String(), Times: f.Times})
		}
		reply(w, out, nil)
	})
	mux.HandleFunc("POST /faults", func(w http.ResponseWriter, r *http.Request) {
		var f faultJSON
		err := decode(r, &f)
		if err == nil {
			var code codes.Code
			if code, err = ParseCode(f.Code); err == nil {
				err = d.SetFault(f.Method, code, f.Times)
			}
		}
		reply(w, nil, err)
	})
	mux.HandleFunc("DELETE /faults", func(w http.ResponseWriter, _ *http.Request) {
		d.ResetFaults()
		reply(w, nil, nil)
	})
	mux.HandleFunc("POST /hangs", func(w http.ResponseWriter, r *http.Request) {
		var h hangJSON
		err := decode(r, &h)
		if err == nil {
			err = d.SetHang(h.Method, h.Hang)
		}
		reply(w, nil, err)
	})
	mux.HandleFunc("POST /crash-after", func(w http.ResponseWriter, r *http.Request) {
		var c crashAfterJSON
		err := decode(r, &c)
		if err == nil {
			d.SetCrashAfter(c.N)
		}
		reply(w, nil, err)
	})
	mux.HandleFunc("GET /volumes", func(w http.ResponseWriter, _ *http.Request) {
		reply(w, d.Volumes(), nil)
	})
	mux.HandleFunc("POST /conditions", func(w http.ResponseWriter, r *http.Request) {
		var c conditionJSON
		err := decode(r, &c)
		if err == nil && c.VolumeID == "" {
			err = fmt.Errorf("volumeID is missing")
		}
		if err == nil {
			d.SetVolumeCondition(c.VolumeID, c.Abnormal, c.Message)
		}
		reply(w, nil, err)
	})
	return mux
}

// ControlClient talks to the control socket of a driver process.
type ControlClient struct {
	http *http.Client
}

// NewControlClient returns a client for the control socket at socketPath.
func NewControlClient(socketPath string) *ControlClient {
	return &ControlClient{http: &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var dialer net.Dialer
				return dialer.DialContext(ctx, "unix", socketPath)
			},
		},
	}}
}

func (c *ControlClient) do(method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(data)
	}
	// The host part is ignored: the transport always dials the socket.
	req, err := http.NewRequest(method, "http://driver"+path, body)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(data))
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// SetFault is Driver.SetFault for a driver process.
func (c *ControlClient) SetFault(method string, code codes.Code, times int) error {
	return c.do(http.MethodPost, "/faults", faultJSON{Method: method, Code: code.String(), Times: times}, nil)
}

// ClearFault is Driver.ClearFault for a driver process.
func (c *ControlClient) ClearFault(method string) error {
	return c.SetFault(method, codes.OK, 0)
}

// Faults is Driver.Faults and Driver.Hangs for a driver process.
func (c *ControlClient) Faults() ([]Fault, []string, error) {
	var in faultsJSON
	if err := c.do(http.MethodGet, "/faults", nil, &in); err != nil {
		return nil, nil, err
	}
	var out []Fault
	for _, f := range in.Faults {
		code, err := ParseCode(f.Code)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, Fault{Method: f.Method, Code: code, Times: f.Times})
	}
	return out, in.Hangs, nil
}

// HungCalls is Driver.HungCalls for a driver process, for a method that
// is set to hang.
func (c *ControlClient) HungCalls(method string) (int, error) {
	var in faultsJSON
	if err := c.do(http.MethodGet, "/faults", nil, &in); err != nil {
		return 0, err
	}
	return in.Hung[method], nil
}

// SetHang is Driver.SetHang for a driver process.
func (c *ControlClient) SetHang(method string, hang bool) error {
	return c.do(http.MethodPost, "/hangs", hangJSON{Method: method, Hang: hang}, nil)
}

// SetCrashAfter is Driver.SetCrashAfter for a driver process.
func (c *ControlClient) SetCrashAfter(n int) error {
	return c.do(http.MethodPost, "/crash-after", crashAfterJSON{N: n}, nil)
}

// ResetFaults is Driver.ResetFaults for a driver process.
func (c *ControlClient) ResetFaults() error {
	return c.do(http.MethodDelete, "/faults", nil, nil)
}

// CallCounts is Driver.CallCounts for a driver process.
func (c *ControlClient) CallCounts() (map[string]int, error) {
	out := map[string]int{}
	err := c.do(http.MethodGet, "/calls", nil, &out)
	return out, err
}

// ResetCallCounts is Driver.ResetCallCounts for a driver process.
func (c *ControlClient) ResetCallCounts() error {
	return c.do(http.MethodDelete, "/calls", nil, nil)
}

// Volumes is Driver.Volumes for a driver process.
func (c *ControlClient) Volumes() ([]VolumeInfo, error) {
	var out []VolumeInfo
	err := c.do(http.MethodGet, "/volumes", nil, &out)
	return out, err
}

// SetVolumeCondition is Driver.SetVolumeCondition for a driver process.
func (c *ControlClient) SetVolumeCondition(id string, abnormal bool, message string) error {
	return c.do(http.MethodPost, "/conditions", conditionJSON{VolumeID: id, Abnormal: abnormal, Message: message}, nil)
}
