package csidriver

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func TestParseFault(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Fault
	}{
		{"NodeStageVolume=Internal", Fault{Method: "NodeStageVolume", Code: codes.Internal}},
		{"NodeStageVolume=DeadlineExceeded:3", Fault{Method: "NodeStageVolume", Code: codes.DeadlineExceeded, Times: 3}},
		{"/csi.v1.Node/NodePublishVolume=RESOURCE_EXHAUSTED:1", Fault{Method: "NodePublishVolume", Code: codes.ResourceExhausted, Times: 1}},
		{"Probe=unavailable", Fault{Method: "Probe", Code: codes.Unavailable}},
		{"GetInfo=cancelled", Fault{Method: "GetInfo", Code: codes.Canceled}},
		{"CreateVolume=10", Fault{Method: "CreateVolume", Code: codes.Aborted}},
	} {
		got, err := ParseFault(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseFault(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		if again, err := ParseFault(got.String()); err != nil || again != got {
			t.Errorf("ParseFault(%q.String()) = %+v, %v", tc.in, again, err)
		}
	}
	for _, bad := range []string{"", "NodeStageVolume", "NodeStageVolume=", "=Internal", "NodeStagevolume=Internal",
		"NodeStageVolume=Bogus", "NodeStageVolume=OK", "NodeStageVolume=Internal:0", "NodeStageVolume=Internal:x"} {
		if f, err := ParseFault(bad); err == nil {
			t.Errorf("ParseFault(%q) = %+v, want an error", bad, f)
		}
	}
}

func TestFaultInjection(t *testing.T) {
	dir := newTestDir(t)
	d, conn := startDriver(t, dir, Config{
		Faults: []Fault{{Method: "GetPluginCapabilities", Code: codes.PermissionDenied}},
	})
	ident := csi.NewIdentityClient(conn)
	ctx := testCtx(t)

	// A fault from the config applies to every call.
	for range 2 {
		_, err := ident.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
		expectCode(t, err, codes.PermissionDenied)
	}

	// A counted fault applies to the next N calls only.
	mustOK(t, d.SetFault("Probe", codes.Unavailable, 2))
	for _, want := range []codes.Code{codes.Unavailable, codes.Unavailable, codes.OK, codes.OK} {
		_, err := ident.Probe(ctx, &csi.ProbeRequest{})
		expectCode(t, err, want)
	}
	if got := d.Faults(); len(got) != 1 || got[0].Method != "GetPluginCapabilities" {
		t.Errorf("Faults() = %+v, want only the GetPluginCapabilities fault", got)
	}
	mustOK(t, d.ClearFault("GetPluginCapabilities"))
	_, err := ident.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	mustOK(t, err)

	// Every call counts, failed or not.
	counts := d.CallCounts()
	if counts["Probe"] != 4 || counts["GetPluginCapabilities"] != 3 {
		t.Errorf("CallCounts() = %v, want Probe:4 GetPluginCapabilities:3", counts)
	}
	if d.CallCount("/csi.v1.Identity/Probe") != 4 {
		t.Errorf("CallCount(full name) = %d, want 4", d.CallCount("/csi.v1.Identity/Probe"))
	}
	d.ResetCallCounts()
	if n := len(d.CallCounts()); n != 0 {
		t.Errorf("after ResetCallCounts: %v", d.CallCounts())
	}

	// Injected codes reach the client whatever they are.
	for _, code := range []codes.Code{codes.DeadlineExceeded, codes.Internal, codes.FailedPrecondition,
		codes.ResourceExhausted, codes.Aborted, codes.Canceled, codes.InvalidArgument} {
		mustOK(t, d.SetFault("NodeGetInfo", code, 1))
		_, err := csi.NewNodeClient(conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
		expectCode(t, err, code)
	}

	if err := d.SetFault("NoSuchMethod", codes.Internal, 0); err == nil {
		t.Error("SetFault accepted an unknown method")
	}
}

func TestHang(t *testing.T) {
	dir := newTestDir(t)
	d, conn := startDriver(t, dir, Config{Hangs: []string{"Probe"}})
	ident := csi.NewIdentityClient(conn)

	// A hung call ends when its context does.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := ident.Probe(ctx, &csi.ProbeRequest{})
	expectCode(t, err, codes.DeadlineExceeded)
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Errorf("hung call returned after %v, before its deadline", took)
	}
	if n := d.CallCount("Probe"); n != 1 {
		t.Errorf("hung call counted %d times, want 1", n)
	}
	// Other methods are not affected.
	_, err = ident.GetPluginInfo(testCtx(t), &csi.GetPluginInfoRequest{})
	mustOK(t, err)

	// Releasing the hang lets a waiting call do its work.
	done := make(chan error, 1)
	go func() {
		_, err := ident.Probe(context.Background(), &csi.ProbeRequest{})
		done <- err
	}()
	// The call waits in the hang (it can leave it only when released: its
	// context never ends and the driver runs).
	waitFor(t, func() bool { return d.faults.hungCalls("Probe") == 1 })
	select {
	case err := <-done:
		t.Fatalf("hung call returned early: %v", err)
	default:
	}
	mustOK(t, d.SetHang("Probe", false))
	select {
	case err := <-done:
		mustOK(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("released call did not return")
	}

	// Stopping the driver ends hung calls too.
	mustOK(t, d.SetHang("GetPluginInfo", true))
	if got := d.Hangs(); len(got) != 1 || got[0] != "GetPluginInfo" {
		t.Errorf("Hangs() = %v", got)
	}
	go func() {
		_, err := ident.GetPluginInfo(context.Background(), &csi.GetPluginInfoRequest{})
		done <- err
	}()
	waitFor(t, func() bool { return d.CallCount("GetPluginInfo") == 2 })
	stopped := make(chan struct{})
	go func() { d.Stop(); close(stopped) }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("hung call succeeded although the driver stopped")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("hung call survived Stop")
	}
	<-stopped
}

func TestCrashAfter(t *testing.T) {
	dir := newTestDir(t)
	exited := make(chan int, 2)
	d, conn := startDriver(t, dir, Config{CrashAfter: 2, Exit: func(code int) { exited <- code }})
	ident := csi.NewIdentityClient(conn)
	ctx := testCtx(t)

	_, err := ident.Probe(ctx, &csi.ProbeRequest{})
	mustOK(t, err)
	d.waitScheduledExits()
	select {
	case code := <-exited:
		t.Fatalf("exited with %d after one call", code)
	default:
	}
	// The last allowed call is answered, then the process exits.
	_, err = ident.Probe(ctx, &csi.ProbeRequest{})
	mustOK(t, err)
	select {
	case code := <-exited:
		if code != 2 {
			t.Errorf("exit code %d, want 2", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("driver did not exit after 2 calls")
	}
	// The driver exits only once.
	d.SetCrashAfter(1)
	_, _ = ident.Probe(ctx, &csi.ProbeRequest{})
	d.waitScheduledExits()
	select {
	case code := <-exited:
		t.Fatalf("exited twice (%d)", code)
	default:
	}
}

func TestCrashAfterRefusesLateCalls(t *testing.T) {
	dir := newTestDir(t)
	var mu sync.Mutex
	var codesSeen []int
	d, conn := startDriver(t, dir, Config{Exit: func(code int) {
		mu.Lock()
		codesSeen = append(codesSeen, code)
		mu.Unlock()
	}})
	ident := csi.NewIdentityClient(conn)
	ctx := testCtx(t)
	_, err := ident.Probe(ctx, &csi.ProbeRequest{})
	mustOK(t, err)
	d.SetCrashAfter(1) // one more call
	_, err = ident.Probe(ctx, &csi.ProbeRequest{})
	mustOK(t, err)
	// Immediately after: the process would be gone, so the call is refused.
	_, err = ident.Probe(ctx, &csi.ProbeRequest{})
	expectCode(t, err, codes.Unavailable)
	d.waitScheduledExits()
	mu.Lock()
	defer mu.Unlock()
	if len(codesSeen) != 1 || codesSeen[0] != 2 {
		t.Errorf("exit calls %v, want exactly one with 2", codesSeen)
	}
}

func TestCallsFile(t *testing.T) {
	dir := newTestDir(t)
	file := filepath.Join(dir, "calls.json")
	_, conn := startDriver(t, dir, Config{CallsFile: file})
	ident := csi.NewIdentityClient(conn)
	for range 3 {
		_, err := ident.Probe(testCtx(t), &csi.ProbeRequest{})
		mustOK(t, err)
	}
	_, err := csi.NewNodeClient(conn).NodeGetCapabilities(testCtx(t), &csi.NodeGetCapabilitiesRequest{})
	mustOK(t, err)
	data, err := os.ReadFile(file)
	mustOK(t, err)
	var counts map[string]int
	mustOK(t, json.Unmarshal(data, &counts))
	if counts["Probe"] != 3 || counts["NodeGetCapabilities"] != 1 || len(counts) != 2 {
		t.Errorf("calls.json = %s", data)
	}
}

func TestControlSocket(t *testing.T) {
	dir := newTestDir(t)
	sock := filepath.Join(dir, "control.sock")
	d, conn := startDriver(t, dir, Config{ControlSocket: sock})
	c := NewControlClient(sock)
	ident := csi.NewIdentityClient(conn)
	ctx := testCtx(t)

	mustOK(t, c.SetFault("Probe", codes.Internal, 1))
	_, err := ident.Probe(ctx, &csi.ProbeRequest{})
	expectCode(t, err, codes.Internal)
	_, err = ident.Probe(ctx, &csi.ProbeRequest{})
	mustOK(t, err)

	mustOK(t, c.SetFault("NodeStageVolume", codes.Aborted, 0))
	mustOK(t, c.SetHang("NodePublishVolume", true))
	faults, hangs, err := c.Faults()
	mustOK(t, err)
	if len(faults) != 1 || faults[0] != (Fault{Method: "NodeStageVolume", Code: codes.Aborted}) || len(hangs) != 1 || hangs[0] != "NodePublishVolume" {
		t.Errorf("Faults() = %+v, %v", faults, hangs)
	}
	if err := c.SetFault("Nope", codes.Internal, 0); err == nil {
		t.Error("control API accepted an unknown method")
	}
	mustOK(t, c.ResetFaults())
	if len(d.Faults()) != 0 || len(d.Hangs()) != 0 {
		t.Errorf("faults left after reset: %v %v", d.Faults(), d.Hangs())
	}

	counts, err := c.CallCounts()
	mustOK(t, err)
	if counts["Probe"] != 2 {
		t.Errorf("CallCounts() = %v", counts)
	}
	mustOK(t, c.ResetCallCounts())
	if counts, _ := c.CallCounts(); len(counts) != 0 {
		t.Errorf("CallCounts() after reset = %v", counts)
	}
	mustOK(t, c.SetCrashAfter(0))
	vols, err := c.Volumes()
	mustOK(t, err)
	if len(vols) != 0 {
		t.Errorf("Volumes() = %v", vols)
	}
}

func TestRegistration(t *testing.T) {
	dir := newTestDir(t)
	regDir := filepath.Join(dir, "plugins_registry")
	d, _ := startDriver(t, dir, Config{Name: "reg.test.io", RegistrationDir: regDir})
	sock := filepath.Join(regDir, "reg.test.io-reg.sock")
	if d.RegistrationSocketPath() != sock {
		t.Errorf("RegistrationSocketPath() = %q, want %q", d.RegistrationSocketPath(), sock)
	}
	client := registerapi.NewRegistrationClient(dial(t, "unix://"+sock))
	ctx := testCtx(t)

	info, err := client.GetInfo(ctx, &registerapi.InfoRequest{})
	mustOK(t, err)
	if info.Type != registerapi.CSIPlugin || info.Name != "reg.test.io" || info.Endpoint != d.SocketPath() ||
		len(info.SupportedVersions) != 1 || info.SupportedVersions[0] != "1.0.0" {
		t.Errorf("GetInfo() = %v", info)
	}
	_, err = client.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: false, Error: "boom"})
	mustOK(t, err)
	_, err = client.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true})
	mustOK(t, err)
	st := d.RegistrationStatuses()
	if len(st) != 2 || st[0].Registered || st[0].Error != "boom" || !st[1].Registered {
		t.Errorf("RegistrationStatuses() = %+v", st)
	}

	// Registration calls can be faulted like CSI calls.
	mustOK(t, d.SetFault("GetInfo", codes.Unavailable, 1))
	_, err = client.GetInfo(ctx, &registerapi.InfoRequest{})
	expectCode(t, err, codes.Unavailable)
	if d.CallCount("GetInfo") != 2 || d.CallCount("NotifyRegistrationStatus") != 2 {
		t.Errorf("CallCounts() = %v", d.CallCounts())
	}

	d.Stop()
	for _, p := range []string{sock, d.SocketPath()} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s still there after Stop: %v", p, err)
		}
	}
}

// waitFor polls cond for up to 10 seconds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
