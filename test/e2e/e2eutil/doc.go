// Package e2eutil is the harness the end-to-end suites under test/e2e
// share, so that each suite's files hold only what is its own:
//
//   - building the agent (with -race when the tests run with it) and the
//     test CSI driver: Build;
//   - a cluster-mode suite's TestMain: RunSuite, which starts one control
//     plane (StartControlPlane: etcd, kube-apiserver and
//     kube-controller-manager from test/cluster, with the RBAC objects
//     rendered from deploy/ and a kubeconfig of the agent's ServiceAccount);
//   - volume-agent processes on free ports, started, stopped, killed and
//     restarted on the same root directory: Agent, with the debug
//     endpoint's documents (DSW, ASW, Operations...) and /metrics;
//   - test CSI driver processes with their control client: CSIDriver;
//   - the real CSI sidecars (external-provisioner, -attacher, -resizer,
//     built by test/tools/build.sh) as processes serving a driver:
//     StartSidecar;
//   - polling: Poll, PollErr;
//   - Kubernetes objects and the parts of absent components the tests play
//     (Pod, the volume constructors, standalone Manifests,
//     ControlPlane.PlayResizer), paths under the agent's root directory and
//     checks of the API server's audit log (RequestKey, Grants).
//
// Mount-table, unmount-everything and loop-device helpers are in
// internal/mounttest. Every child process is started so that it dies with
// the test binary, and everything a test starts is stopped, unmounted and
// detached when it ends, also when it fails.
package e2eutil
