package mounttest

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// isolatedEnv names the test a child process runs in its own mount
// namespace.
const isolatedEnv = "VOLUME_AGENT_TEST_OWN_MOUNT_NAMESPACE"

// OwnMountNamespace runs the calling top-level test again in a child
// process that has a mount namespace of its own, where no mount made
// elsewhere on the machine is seen and none of the test's mounts is seen
// outside (they all vanish with the child). Tests of mount table watchers
// need it: on a shared machine, other tests' mounts wake a watcher too and
// would hide a change it missed.
//
// In the parent it returns false once the child has run (the child's
// output and result are the test's); the test must then return. In the
// child it returns true and the test goes on. Root is required.
func OwnMountNamespace(t *testing.T) bool {
	t.Helper()
	RequireRoot(t)
	if os.Getenv(isolatedEnv) == t.Name() {
		// Mounts made on the host after the namespace was copied must
		// not propagate in, nor ours out.
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			t.Fatalf("making the test's mount namespace private: %v", err)
		}
		return true
	}
	args := []string{"-test.run=^" + regexp.QuoteMeta(t.Name()) + "$", "-test.count=1", "-test.v"}
	cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
	cmd.Env = append(os.Environ(), isolatedEnv+"="+t.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	t.Logf("in its own mount namespace (child process):\n%s", out)
	if err != nil {
		t.Fatalf("the test failed in its own mount namespace: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()+" ") {
		t.Fatalf("the child process did not run and pass %s", t.Name())
	}
	return false
}
