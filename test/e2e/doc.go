// Package e2e holds integration tests of the volume-agent binary in
// standalone mode: each test builds nothing itself (TestMain builds
// cmd/volume-agent once), starts the agent on a temporary root directory and
// manifest directory, changes the manifests and checks the kernel's mount
// table and the agent's debug endpoint.
//
// The tests need root (they mount tmpfs, bind mounts and loop devices) and
// skip otherwise, or fail where root is required (e2eutil.Skip). Set VOLUME_AGENT_BINARY to test a binary built elsewhere.
package e2e
