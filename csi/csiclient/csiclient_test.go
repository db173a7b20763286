package csiclient_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/volume-agent/volume-agent/csi/csiclient"
	"github.com/volume-agent/volume-agent/volume"
)

// The CSI rule for what an error means: a call that may still be running or
// may have taken effect leaves the operation uncertain (retried while the
// volume is wanted, undone when not); any other answer is final.
func TestErrorClasses(t *testing.T) {
	uncertainCodes := map[codes.Code]bool{
		codes.Canceled: true, codes.DeadlineExceeded: true, codes.Unavailable: true,
		codes.ResourceExhausted: true, codes.Aborted: true,
	}
	type errCase struct {
		name      string
		err       error
		uncertain bool
		code      codes.Code
	}
	var cases []errCase
	for c := codes.OK + 1; c <= codes.Unauthenticated; c++ {
		st := status.Error(c, "driver says so")
		cases = append(cases,
			errCase{name: c.String(), err: st, uncertain: uncertainCodes[c], code: c},
			// Callers wrap errors with what they were doing.
			errCase{name: c.String() + " wrapped", err: fmt.Errorf("NodeStageVolume of vol-1: %w", st), uncertain: uncertainCodes[c], code: c},
		)
	}
	cases = append(cases,
		// The context ending on our side says nothing about the driver.
		// (Code is the driver's code: these have none.)
		errCase{name: "context deadline", err: context.DeadlineExceeded, uncertain: true, code: codes.Unknown},
		errCase{name: "context canceled, wrapped", err: fmt.Errorf("waiting: %w", context.Canceled), uncertain: true, code: codes.Unknown},
		// Not an answer from the driver at all (a broken connection).
		errCase{name: "not a gRPC status", err: errors.New("connection reset by peer"), uncertain: true, code: codes.Unknown},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := csiclient.IsFinal(c.err); got == c.uncertain {
				t.Errorf("IsFinal = %v, want %v", got, !c.uncertain)
			}
			classified := csiclient.Classify(c.err)
			if volume.IsUncertain(classified) != c.uncertain {
				t.Errorf("Classify: uncertain %v, want %v", volume.IsUncertain(classified), c.uncertain)
			}
			if !errors.Is(classified, c.err) {
				t.Errorf("Classify lost the error: %v", classified)
			}
			if got := csiclient.Code(classified); got != c.code {
				t.Errorf("Code(Classify(err)) = %v, want %v", got, c.code)
			}
		})
	}
}

func TestNoError(t *testing.T) {
	if !csiclient.IsFinal(nil) || csiclient.Classify(nil) != nil || csiclient.Code(nil) != codes.OK {
		t.Errorf("nil: IsFinal %v, Classify %v, Code %v; want true, nil, OK",
			csiclient.IsFinal(nil), csiclient.Classify(nil), csiclient.Code(nil))
	}
}

func TestSocketPath(t *testing.T) {
	cases := []struct {
		endpoint, want string
		wantErr        bool
	}{
		{endpoint: "unix:///csi/csi.sock", want: "/csi/csi.sock"},
		{endpoint: "unix:/csi/csi.sock", want: "/csi/csi.sock"},
		{endpoint: "/csi/csi.sock", want: "/csi/csi.sock"},
		{endpoint: "unix://csi.sock", wantErr: true},
		{endpoint: "csi.sock", wantErr: true},
		{endpoint: "tcp://127.0.0.1:10000", wantErr: true},
		{endpoint: "", wantErr: true},
	}
	for _, c := range cases {
		got, err := csiclient.SocketPath(c.endpoint)
		if (err != nil) != c.wantErr || got != c.want {
			t.Errorf("SocketPath(%q) = %q, %v; want %q, error %v", c.endpoint, got, err, c.want, c.wantErr)
		}
		if _, err := csiclient.New(c.endpoint); (err != nil) != c.wantErr {
			t.Errorf("New(%q): %v, want an error %v", c.endpoint, err, c.wantErr)
		}
	}
}
