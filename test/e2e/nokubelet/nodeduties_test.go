package nokubelet_test

import "github.com/volume-agent/volume-agent/test/e2e/e2eutil"

// waitNodeDuties waits until the node publishes the driver as the kubelet
// would (e2eutil.CheckNodeDuties), in attach mode controller.
func (e *env) waitNodeDuties(driver, nodeID string, topology map[string]string, count int64) {
	e.t.Helper()
	suite.WaitNodeDuties(e.t, e.node, e2eutil.NodeDuty{
		Driver: driver, NodeID: nodeID, Topology: topology, MaxVolumes: count, ControllerAttach: true,
	})
}

// waitNodeDutiesGone waits until the node no longer publishes the driver
// (e2eutil.CheckNodeDutiesGone).
func (e *env) waitNodeDutiesGone(driver string) {
	e.t.Helper()
	suite.WaitNodeDutiesGone(e.t, e.node, driver)
}
