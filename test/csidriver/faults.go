package csidriver

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Fault makes a gRPC method of the driver fail with a status code.
type Fault struct {
	// Method is the gRPC method name, short ("NodeStageVolume") or full
	// ("/csi.v1.Node/NodeStageVolume").
	Method string
	// Code is the status code the method returns instead of doing its work.
	Code codes.Code
	// Times is how many of the next calls fail; 0 or less means every call.
	Times int
}

// String formats f the way ParseFault reads it.
func (f Fault) String() string {
	s := f.Method + "=" + f.Code.String()
	if f.Times > 0 {
		s += ":" + strconv.Itoa(f.Times)
	}
	return s
}

// ParseFault parses "METHOD=CODE[:N]", e.g. "NodeStageVolume=Internal:2".
// CODE is a gRPC code name in any case, with or without underscores
// ("DeadlineExceeded", "DEADLINE_EXCEEDED") or its number.
func ParseFault(s string) (Fault, error) {
	method, rest, ok := strings.Cut(s, "=")
	if !ok || method == "" || rest == "" {
		return Fault{}, fmt.Errorf("fault %q: want METHOD=CODE[:N]", s)
	}
	name, err := MethodName(method)
	if err != nil {
		return Fault{}, err
	}
	codeStr, timesStr, hasTimes := strings.Cut(rest, ":")
	code, err := ParseCode(codeStr)
	if err != nil {
		return Fault{}, fmt.Errorf("fault %q: %w", s, err)
	}
	if code == codes.OK {
		return Fault{}, fmt.Errorf("fault %q: OK is not a fault", s)
	}
	f := Fault{Method: name, Code: code}
	if hasTimes {
		n, err := strconv.Atoi(timesStr)
		if err != nil || n <= 0 {
			return Fault{}, fmt.Errorf("fault %q: N must be a positive number", s)
		}
		f.Times = n
	}
	return f, nil
}

// ParseCode turns a gRPC status code name (any case, underscores optional)
// or number into a codes.Code.
func ParseCode(s string) (codes.Code, error) {
	want := strings.ToLower(strings.ReplaceAll(strings.TrimSpace(s), "_", ""))
	if n, err := strconv.Atoi(want); err == nil && n >= 0 && n <= int(codes.Unauthenticated) {
		return codes.Code(n), nil
	}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if strings.ToLower(c.String()) == want {
			return c, nil
		}
	}
	// codes.Canceled also goes by its British spelling in the gRPC docs.
	if want == "cancelled" {
		return codes.Canceled, nil
	}
	return 0, fmt.Errorf("unknown gRPC code %q", s)
}

// knownMethods maps every short method name the driver serves to true.
var knownMethods = func() map[string]bool {
	m := map[string]bool{}
	for _, desc := range []grpc.ServiceDesc{
		csi.Identity_ServiceDesc, csi.Controller_ServiceDesc, csi.Node_ServiceDesc,
		registerapi.Registration_ServiceDesc,
	} {
		for _, md := range desc.Methods {
			m[md.MethodName] = true
		}
	}
	return m
}()

// MethodName validates a gRPC method name and returns its short form:
// "/csi.v1.Node/NodeStageVolume" and "NodeStageVolume" both give
// "NodeStageVolume". Methods the driver does not serve are an error, so that
// a typo in a test's fault does not go unnoticed.
func MethodName(method string) (string, error) {
	short := method[strings.LastIndex(method, "/")+1:]
	if !knownMethods[short] {
		return "", fmt.Errorf("unknown gRPC method %q", method)
	}
	return short, nil
}

// crashFlushDelay is how long the driver waits after answering the last call
// allowed by crash-after before it exits, so the answer reaches the caller.
const crashFlushDelay = 100 * time.Millisecond

type faultEntry struct {
	code      codes.Code
	remaining int // < 0: forever
}

// injector implements fault injection and call counting as a gRPC unary
// interceptor. Its maps and counters are guarded by mu, fileErrLog by fileMu.
type injector struct {
	log *zap.Logger

	mu         sync.Mutex
	faults     map[string]*faultEntry
	hangs      map[string]chan struct{} // closed to release the hung calls
	calls      map[string]int
	total      int // CSI calls so far, for crash-after
	crashAt    int // exit once total reaches this; 0: never
	crashed    bool
	exit       func(int)
	stopped    chan struct{} // closed when the driver stops
	stopOnce   sync.Once
	callsFile  string
	fileMu     sync.Mutex // serialises writes of callsFile
	fileErrLog bool

	// hung counts the calls waiting in a hang, by method (guarded by mu).
	hung map[string]int
	// exits counts the exits crash-after scheduled that have not happened
	// yet.
	exits sync.WaitGroup
}

func newInjector(log *zap.Logger, exit func(int), callsFile string) *injector {
	return &injector{
		log:       log,
		faults:    map[string]*faultEntry{},
		hangs:     map[string]chan struct{}{},
		hung:      map[string]int{},
		calls:     map[string]int{},
		exit:      exit,
		stopped:   make(chan struct{}),
		callsFile: callsFile,
	}
}

func (in *injector) setFault(f Fault) error {
	name, err := MethodName(f.Method)
	if err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if f.Code == codes.OK {
		delete(in.faults, name)
		return nil
	}
	remaining := f.Times
	if remaining <= 0 {
		remaining = -1
	}
	in.faults[name] = &faultEntry{code: f.Code, remaining: remaining}
	return nil
}

func (in *injector) listFaults() []Fault {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make([]Fault, 0, len(in.faults))
	for name, e := range in.faults {
		f := Fault{Method: name, Code: e.code}
		if e.remaining > 0 {
			f.Times = e.remaining
		}
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Method < out[j].Method })
	return out
}

func (in *injector) setHang(method string, hang bool) error {
	name, err := MethodName(method)
	if err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	ch, hanging := in.hangs[name]
	switch {
	case hang && !hanging:
		in.hangs[name] = make(chan struct{})
	case !hang && hanging:
		close(ch)
		delete(in.hangs, name)
	}
	return nil
}

func (in *injector) listHangs() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make([]string, 0, len(in.hangs))
	for name := range in.hangs {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

func (in *injector) setCrashAfter(n int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if n <= 0 {
		in.crashAt = 0
		return
	}
	in.crashAt = in.total + n
}

func (in *injector) reset() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.faults = map[string]*faultEntry{}
	for _, ch := range in.hangs {
		close(ch)
	}
	in.hangs = map[string]chan struct{}{}
	in.crashAt = 0
}

func (in *injector) callCounts() map[string]int {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make(map[string]int, len(in.calls))
	for k, v := range in.calls {
		out[k] = v
	}
	return out
}

func (in *injector) resetCalls() {
	in.mu.Lock()
	in.calls = map[string]int{}
	in.mu.Unlock()
	in.writeCallsFile()
}

// stop releases calls that hang; they fail with Unavailable.
func (in *injector) stop() {
	in.stopOnce.Do(func() { close(in.stopped) })
}

// writeCallsFile replaces callsFile with the current counts. The snapshot is
// taken while holding fileMu so that a slower writer can never overwrite a
// newer snapshot with an older one.
func (in *injector) writeCallsFile() {
	if in.callsFile == "" {
		return
	}
	in.fileMu.Lock()
	defer in.fileMu.Unlock()
	data, err := json.MarshalIndent(in.callCounts(), "", "  ")
	if err == nil {
		err = writeFileAtomic(in.callsFile, append(data, '\n'))
	}
	if err != nil && !in.fileErrLog {
		in.fileErrLog = true // once is enough; this would repeat on every call
		in.log.Error("cannot write call counts", zap.String("file", in.callsFile), zap.Error(err))
	}
}

// interceptor returns the unary interceptor. Calls through an interceptor
// made with countsForCrash=false (the registration socket) are counted per
// method but do not move the process towards crash-after.
func (in *injector) interceptor(countsForCrash bool) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		method := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
		start := time.Now()

		in.mu.Lock()
		in.calls[method]++
		lastCall := false
		if countsForCrash {
			in.total++
			if in.crashAt > 0 && in.total > in.crashAt {
				// A call that arrives while the process is on its way
				// out: die now without touching anything.
				in.crashLocked(method, 0)
				in.mu.Unlock()
				return nil, status.Error(codes.Unavailable, "driver crashed")
			}
			lastCall = in.crashAt > 0 && in.total == in.crashAt
		}
		hang := in.hangs[method]
		in.mu.Unlock()
		in.writeCallsFile()

		if hang != nil {
			if err := in.hang(ctx, method, hang); err != nil {
				return nil, err
			}
		}

		resp, err := in.takeFault(method)
		if err == nil {
			resp, err = handler(ctx, req)
		}
		in.log.Debug("call", zap.String("method", method), zap.Duration("took", time.Since(start)),
			zap.Stringer("code", status.Code(err)), zap.Error(err))
		if lastCall {
			in.mu.Lock()
			in.crashLocked(method, crashFlushDelay)
			in.mu.Unlock()
		}
		return resp, err
	}
}

// hang waits until the hang is released (nil), or the call's context ends
// or the driver stops (the call's error).
func (in *injector) hang(ctx context.Context, method string, release <-chan struct{}) error {
	in.log.Info("hanging call", zap.String("method", method))
	in.mu.Lock()
	in.hung[method]++
	in.mu.Unlock()
	defer func() {
		in.mu.Lock()
		in.hung[method]--
		in.mu.Unlock()
	}()
	select {
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-in.stopped:
		return status.Error(codes.Unavailable, "driver is stopping")
	case <-release:
		in.log.Info("hung call released", zap.String("method", method))
		return nil
	}
}

// hungCalls is how many calls of method wait in a hang.
func (in *injector) hungCalls(method string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.hung[method]
}

// takeFault consumes one injected failure for method, if any.
func (in *injector) takeFault(method string) (any, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	e := in.faults[method]
	if e == nil {
		return nil, nil
	}
	if e.remaining > 0 {
		e.remaining--
		if e.remaining == 0 {
			delete(in.faults, method)
		}
	}
	in.log.Info("injecting fault", zap.String("method", method), zap.Stringer("code", e.code))
	return nil, status.Errorf(e.code, "injected fault: %s returns %s", method, e.code)
}

// crashLocked calls exit(2) once, after delay. in.mu must be held.
func (in *injector) crashLocked(method string, delay time.Duration) {
	if in.crashed {
		return
	}
	in.crashed = true
	in.log.Warn("crash-after reached, exiting", zap.String("lastMethod", method), zap.Int("calls", in.total))
	exit := in.exit
	if delay == 0 {
		exit(2)
		return
	}
	in.exits.Add(1)
	time.AfterFunc(delay, func() {
		defer in.exits.Done()
		exit(2)
	})
}
