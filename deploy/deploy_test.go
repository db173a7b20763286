package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/volume-agent/volume-agent/localpv"
	"github.com/volume-agent/volume-agent/test/cluster"
)

// render builds a kustomization directory (relative to deploy/) the way
// `kubectl kustomize` does and returns its objects in kustomize's order.
func render(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, r := range resMap.Resources() {
		// Through JSON: r.Map() holds Go ints, which unstructured objects
		// must not (they hold int64 and float64, as decoded JSON does).
		data, err := r.MarshalJSON()
		if err != nil {
			t.Fatalf("kustomize build %s: %s: %v", dir, r.CurId(), err)
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(data); err != nil {
			t.Fatalf("kustomize build %s: %s: %v", dir, r.CurId(), err)
		}
		out = append(out, obj)
	}
	if len(out) == 0 {
		t.Fatalf("kustomize build %s: no objects", dir)
	}
	return out
}

// find returns the one rendered object of a kind, converted to a typed value.
func find[T any](t *testing.T, objs []*unstructured.Unstructured, kind string) *T {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d objects of kind %s rendered, want 1", len(found), kind)
	}
	out := new(T)
	// With validation: a field the typed API does not know is a typo.
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(found[0].Object, out, true); err != nil {
		t.Fatalf("%s %s: %v", kind, found[0].GetName(), err)
	}
	return out
}

// flagValues parses the container's --flag=value arguments.
func flagValues(t *testing.T, args []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok || !strings.HasPrefix(k, "--") {
			t.Fatalf("argument %q is not --flag=value", a)
		}
		out[k] = v
	}
	return out
}

// kustomizations lists deploy/ and every directory below it with a
// kustomization.yaml (the base and the overlays), relative to deploy/.
func kustomizations(t *testing.T) []string {
	t.Helper()
	dirs := []string{"."}
	matches, err := filepath.Glob(filepath.Join("*", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range matches {
		dirs = append(dirs, filepath.Dir(m))
	}
	slices.Sort(dirs[1:])
	if !slices.Contains(dirs, "monitoring") {
		t.Fatalf("no deploy/monitoring kustomization among %q", dirs)
	}
	return dirs
}

func objectIDs(objs []*unstructured.Unstructured) []string {
	var ids []string
	for _, o := range objs {
		ids = append(ids, o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName())
	}
	return ids
}

// TestRenderedInvariants renders deploy/ and every overlay and checks what
// the agent needs from its DaemonSet and RBAC in each of them.
func TestRenderedInvariants(t *testing.T) {
	base := render(t, ".")
	for _, dir := range kustomizations(t) {
		t.Run(dir, func(t *testing.T) {
			objs := base
			if dir != "." {
				objs = render(t, dir)
				// An overlay adds to the base; it drops nothing.
				ids := objectIDs(objs)
				for _, id := range objectIDs(base) {
					if !slices.Contains(ids, id) {
						t.Errorf("deploy/%s lacks the base's %s", dir, id)
					}
				}
			}
			checkRendered(t, dir, objs)
		})
	}
}

func checkRendered(t *testing.T, dir string, objs []*unstructured.Unstructured) {
	ns := find[corev1.Namespace](t, objs, "Namespace")
	sa := find[corev1.ServiceAccount](t, objs, "ServiceAccount")
	ds := find[appsv1.DaemonSet](t, objs, "DaemonSet")
	svc := find[corev1.Service](t, objs, "Service")

	for _, o := range objs {
		if o.GetNamespace() != "" && o.GetNamespace() != ns.Name {
			t.Errorf("%s %s is in namespace %q, not %q", o.GetKind(), o.GetName(), o.GetNamespace(), ns.Name)
		}
	}
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Errorf("namespace %s: pod-security enforce label is %q; the privileged agent would be rejected",
			ns.Name, ns.Labels["pod-security.kubernetes.io/enforce"])
	}

	// RBAC wiring: the DaemonSet runs as the ServiceAccount that every
	// binding grants its (rendered) ClusterRole to.
	if ds.Spec.Template.Spec.ServiceAccountName != sa.Name {
		t.Errorf("DaemonSet serviceAccountName %q, ServiceAccount is %q", ds.Spec.Template.Spec.ServiceAccountName, sa.Name)
	}
	roles := map[string]bool{}
	bindings := 0
	for _, o := range objs {
		switch o.GetKind() {
		case "ClusterRole":
			roles[o.GetName()] = true
		}
	}
	// PodCertificateRequests are made with the node's identity only
	// (docs/api-volumes.md#pod-certificates): RBAC could not limit a grant
	// to the node's pods, so the ServiceAccount gets none, in any overlay.
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" && o.GetKind() != "Role" {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
		for _, r := range rules {
			res, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
			if slices.ContainsFunc(res, func(s string) bool { return s == "*" || strings.HasPrefix(s, "podcertificaterequests") }) {
				t.Errorf("%s %s grants %v: PodCertificateRequests are the node identity's", o.GetKind(), o.GetName(), res)
			}
		}
	}
	for _, o := range objs {
		if o.GetKind() != "ClusterRoleBinding" {
			continue
		}
		bindings++
		binding := &rbacv1.ClusterRoleBinding{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, binding, true); err != nil {
			t.Fatalf("ClusterRoleBinding %s: %v", o.GetName(), err)
		}
		if binding.RoleRef.Kind != "ClusterRole" || !roles[binding.RoleRef.Name] {
			t.Errorf("ClusterRoleBinding %s: roleRef %+v is not a rendered ClusterRole", binding.Name, binding.RoleRef)
		}
		if !slices.ContainsFunc(binding.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == sa.Name && s.Namespace == sa.Namespace
		}) {
			t.Errorf("ClusterRoleBinding %s: subjects %+v do not include ServiceAccount %s/%s", binding.Name, binding.Subjects, sa.Namespace, sa.Name)
		}
	}
	if bindings == 0 || len(roles) == 0 {
		t.Error("no ClusterRole or no ClusterRoleBinding")
	}
	checkAdmissionPolicies(t, objs, sa)

	// The DaemonSet.
	spec := ds.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("DaemonSet has %d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	if c.Image == "volume-agent" || !strings.Contains(c.Image, ":") {
		t.Errorf("image %q: the kustomization's images transformer did not apply", c.Image)
	}
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("container is not privileged: it cannot mount")
	}
	flags := flagValues(t, c.Args)
	rootDir, hostRoot := flags["--root-dir"], flags["--host-root"]
	if rootDir == "" || hostRoot == "" {
		t.Fatalf("args %q lack --root-dir or --host-root", c.Args)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	mountAt := func(path string) (corev1.VolumeMount, *corev1.HostPathVolumeSource) {
		t.Helper()
		for _, m := range c.VolumeMounts {
			if m.MountPath == path {
				v, ok := volumes[m.Name]
				if !ok || v.HostPath == nil {
					t.Fatalf("mount at %s: volume %q is not a hostPath volume", path, m.Name)
				}
				return m, v.HostPath
			}
		}
		t.Fatalf("no volume mounted at %s", path)
		return corev1.VolumeMount{}, nil
	}
	// The root directory: Bidirectional, or the mounts the agent makes
	// stay inside its container; and the same path on the host, so that the
	// paths the agent reports are the host's.
	m, hp := mountAt(rootDir)
	if m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
		t.Errorf("root dir %s: mountPropagation %v, want Bidirectional", rootDir, m.MountPropagation)
	}
	if hp.Path != rootDir {
		t.Errorf("root dir %s is the host's %s: paths would differ between agent and host", rootDir, hp.Path)
	}
	if m.ReadOnly {
		t.Errorf("root dir %s is mounted read-only", rootDir)
	}
	// The CSI registration directory (node-driver-registrar's sockets) is
	// the host's same directory, through some hostPath mount.
	registry := flags["--plugin-registry-dir"]
	if registry == "" {
		registry = filepath.Join(rootDir, "plugins_registry")
	}
	covered := false
	for _, m := range c.VolumeMounts {
		if v, ok := volumes[m.Name]; ok && v.HostPath != nil && v.HostPath.Path == m.MountPath &&
			(registry == m.MountPath || strings.HasPrefix(registry, m.MountPath+"/")) {
			covered = true
		}
	}
	if !covered {
		t.Errorf("the plugin registry directory %s is not the host's: no hostPath mount at the same path covers it", registry)
	}
	// Block devices of local volumes.
	if _, hp := mountAt("/dev"); hp.Path != "/dev" {
		t.Errorf("/dev is the host's %s, want /dev", hp.Path)
	}
	// The host's filesystem for hostPath and local paths.
	m, hp = mountAt(hostRoot)
	if hp.Path != "/" {
		t.Errorf("--host-root %s is the host's %s, want /", hostRoot, hp.Path)
	}
	if m.MountPropagation == nil || *m.MountPropagation == corev1.MountPropagationNone {
		t.Errorf("--host-root %s: mountPropagation %v; mounts made on the host later would be invisible", hostRoot, m.MountPropagation)
	}

	// NODE_NAME from the downward API, used by --node-name.
	var nodeEnv *corev1.EnvVar
	for i := range c.Env {
		if c.Env[i].Name == "NODE_NAME" {
			nodeEnv = &c.Env[i]
		}
	}
	if nodeEnv == nil || nodeEnv.ValueFrom == nil || nodeEnv.ValueFrom.FieldRef == nil || nodeEnv.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("NODE_NAME is not set from spec.nodeName: %+v", nodeEnv)
	}
	if v, ok := flags["--node-name"]; ok && v != "$(NODE_NAME)" {
		t.Errorf("--node-name=%s, want $(NODE_NAME)", v)
	}

	// Probes on the health port, which listens on the pod's address (the
	// debug endpoint is loopback only) apart from the metrics port, so
	// that a flood of scrapes cannot starve them.
	healthAddr := flags["--health-address"]
	_, healthPortStr, err := net.SplitHostPort(healthAddr)
	if err != nil {
		t.Fatalf("--health-address %q: %v", healthAddr, err)
	}
	if host, _, _ := net.SplitHostPort(healthAddr); host != "" && host != "0.0.0.0" {
		t.Errorf("--health-address %q is not reachable from the kubelet's probes", healthAddr)
	}
	var healthPort int32
	if _, err := fmt.Sscan(healthPortStr, &healthPort); err != nil {
		t.Fatal(err)
	}
	_, metricsPortStr, err := net.SplitHostPort(flags["--metrics-address"])
	if err != nil {
		t.Fatalf("--metrics-address %q: %v", flags["--metrics-address"], err)
	}
	if metricsPortStr == healthPortStr {
		t.Errorf("--health-address and --metrics-address share port %s: a flood of scrapes would starve the probes", healthPortStr)
	}
	var metricsPort int32
	if _, err := fmt.Sscan(metricsPortStr, &metricsPort); err != nil {
		t.Fatal(err)
	}
	containerPort := func(p intstr.IntOrString) int32 {
		if p.Type == intstr.Int {
			return p.IntVal
		}
		for _, cp := range c.Ports {
			if cp.Name == p.StrVal {
				return cp.ContainerPort
			}
		}
		t.Errorf("container has no port named %q", p.StrVal)
		return 0
	}
	for _, probe := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if probe.probe == nil || probe.probe.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", probe.name)
			continue
		}
		if got := probe.probe.HTTPGet.Path; got != probe.path {
			t.Errorf("%s probe path %q, want %q", probe.name, got, probe.path)
		}
		if got := containerPort(probe.probe.HTTPGet.Port); got != healthPort {
			t.Errorf("%s probe on port %d, the health endpoint listens on %d", probe.name, got, healthPort)
		}
	}

	// Resources: requests for scheduling, a memory limit against leaks.
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := c.Resources.Requests[r]; !ok || q.IsZero() {
			t.Errorf("no %s request", r)
		}
	}
	limit, ok := c.Resources.Limits[corev1.ResourceMemory]
	if !ok || limit.IsZero() {
		t.Error("no memory limit")
	} else if req := c.Resources.Requests[corev1.ResourceMemory]; req.Cmp(limit) > 0 {
		t.Errorf("memory request %s exceeds the limit %s", req.String(), limit.String())
	}
	if spec.TerminationGracePeriodSeconds == nil || time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second < 30*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v is shorter than the agent's default --shutdown-grace-period (30s)", spec.TerminationGracePeriodSeconds)
	}
	if !slices.ContainsFunc(spec.Tolerations, func(t corev1.Toleration) bool { return t.Operator == corev1.TolerationOpExists && t.Key == "" }) {
		t.Error("no toleration of every taint: tainted nodes would have no agent")
	}

	// The Service selects the DaemonSet's pods and targets the metrics port.
	podLabels := ds.Spec.Template.Labels
	for k, v := range svc.Spec.Selector {
		if podLabels[k] != v {
			t.Errorf("Service selector %s=%s does not match the pod labels %v", k, v, podLabels)
		}
	}
	if len(svc.Spec.Selector) == 0 {
		t.Error("Service has no selector")
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil || sel.Empty() {
		t.Errorf("DaemonSet selector %v: %v", ds.Spec.Selector, err)
	}
	var svcPortNames []string
	for _, p := range svc.Spec.Ports {
		svcPortNames = append(svcPortNames, p.Name)
		if got := containerPort(p.TargetPort); got != metricsPort {
			t.Errorf("Service port %s targets container port %d, the metrics endpoint is %d", p.Name, got, metricsPort)
		}
	}

	checkNetworkPolicy(t, objs, podLabels, containerPort, metricsPort)

	// A ServiceMonitor (deploy/monitoring) selects the Service and scrapes
	// one of its ports.
	var sm *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "ServiceMonitor" {
			sm = o
		}
	}
	if sm == nil {
		if dir == "monitoring" {
			t.Error("deploy/monitoring renders no ServiceMonitor")
		}
		return
	}
	if sm.GetNamespace() != svc.Namespace {
		t.Errorf("ServiceMonitor in namespace %q, Service in %q", sm.GetNamespace(), svc.Namespace)
	}
	matchLabels, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	if len(matchLabels) == 0 {
		t.Error("ServiceMonitor has no spec.selector.matchLabels")
	}
	for k, v := range matchLabels {
		if svc.Labels[k] != v {
			t.Errorf("ServiceMonitor selects %s=%s; the Service's labels are %v", k, v, svc.Labels)
		}
	}
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(endpoints) == 0 {
		t.Error("ServiceMonitor has no endpoints")
	}
	for _, e := range endpoints {
		port, _, _ := unstructured.NestedString(e.(map[string]any), "port")
		if !slices.Contains(svcPortNames, port) {
			t.Errorf("ServiceMonitor endpoint port %q is not a Service port %v", port, svcPortNames)
		}
	}
}

// checkNetworkPolicy: a NetworkPolicy selects the agent's pods and admits
// ingress only to the metrics port, only from namespaces chosen by label
// (the monitoring namespace): the metrics endpoint listens on the pod's
// address, and anyone else reaching it is load the agent need not carry.
func checkNetworkPolicy(t *testing.T, objs []*unstructured.Unstructured, podLabels map[string]string, containerPort func(intstr.IntOrString) int32, metricsPort int32) {
	t.Helper()
	np := find[networkingv1.NetworkPolicy](t, objs, "NetworkPolicy")
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(podLabels)) {
		t.Errorf("NetworkPolicy %s selects %v (%v), not the agent's pods %v", np.Name, np.Spec.PodSelector, err, podLabels)
	}
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Errorf("NetworkPolicy %s policyTypes %v lack Ingress: it restricts nothing", np.Name, np.Spec.PolicyTypes)
	}
	if len(np.Spec.Ingress) == 0 {
		t.Errorf("NetworkPolicy %s admits nothing: the metrics would not be scraped", np.Name)
	}
	for i, rule := range np.Spec.Ingress {
		if len(rule.Ports) == 0 {
			t.Errorf("ingress rule %d admits every port", i)
		}
		for _, p := range rule.Ports {
			if p.Port == nil || containerPort(*p.Port) != metricsPort {
				t.Errorf("ingress rule %d admits port %v, not only the metrics port %d", i, p.Port, metricsPort)
			}
		}
		if len(rule.From) == 0 {
			t.Errorf("ingress rule %d admits every source", i)
		}
		for _, peer := range rule.From {
			if peer.IPBlock != nil || peer.NamespaceSelector == nil ||
				(len(peer.NamespaceSelector.MatchLabels) == 0 && len(peer.NamespaceSelector.MatchExpressions) == 0) {
				t.Errorf("ingress rule %d admits %+v, not a namespace chosen by label", i, peer)
			}
		}
	}
}

// serviceMonitorCRD stands in for the Prometheus Operator's CRD of
// ServiceMonitors (monitoring.coreos.com/v1), which is large and not a
// dependency of this project: the same group, version, kind and scope, and a
// small schema for the fields deploy/monitoring sets; everything else is
// preserved, not validated.
const serviceMonitorCRD = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: servicemonitors.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names:
    kind: ServiceMonitor
    listKind: ServiceMonitorList
    plural: servicemonitors
    singular: servicemonitor
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        required: [spec]
        properties:
          spec:
            type: object
            required: [selector]
            x-kubernetes-preserve-unknown-fields: true
            properties:
              selector:
                type: object
                x-kubernetes-preserve-unknown-fields: true
              endpoints:
                type: array
                items:
                  type: object
                  x-kubernetes-preserve-unknown-fields: true
                  properties:
                    port: {type: string}
                    path: {type: string}
                    interval: {type: string}
`

// TestServerSideDryRun proves the manifests are valid by sending every
// rendered object to a real kube-apiserver as a server-side apply with
// dryRun=All and strict field validation: schema validation, defaulting and
// admission (PodSecurity, RBAC escalation checks...) run, nothing is stored.
func TestServerSideDryRun(t *testing.T) {
	type rendered struct {
		dir  string
		objs []*unstructured.Unstructured
	}
	var sets []rendered
	for _, dir := range kustomizations(t) {
		sets = append(sets, rendered{"deploy/" + dir, render(t, dir)})
	}
	base := sets[0].objs

	c := cluster.StartForTest(t, cluster.Options{})
	ctx := t.Context()
	cfg := c.RESTConfig()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// The ServiceMonitor kind must be known to the API server first. This
	// one is really created: a dry run cannot make a kind exist.
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(serviceMonitorCRD), &crd.Object); err != nil {
		t.Fatal(err)
	}
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CRD: %v", err)
	}
	smGVK := schema.GroupVersionKind{Group: "monitoring.coreos.com", Version: "v1", Kind: "ServiceMonitor"}
	var mapper meta.RESTMapper
	// Established, then served: discovery lists the new group shortly after.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := dyn.Resource(crdGVR).Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		established := false
		for _, c := range conds {
			m := c.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				established = true
			}
		}
		if !established {
			return false, nil
		}
		groups, err := restmapper.GetAPIGroupResources(disco)
		if err != nil {
			return false, nil // discovery can fail while a group is being added
		}
		mapper = restmapper.NewDiscoveryRESTMapper(groups)
		_, err = mapper.RESTMapping(smGVK.GroupKind(), smGVK.Version)
		return err == nil, nil
	}); err != nil {
		t.Fatalf("CRD %s never became usable: %v", crd.GetName(), err)
	}

	// Namespaced objects, even in a dry run, are rejected by the
	// NamespaceLifecycle admission plugin unless their namespace exists: the
	// Namespace is created for real first. Its dry-run apply below then
	// checks the rendered Namespace as an update of the same object.
	ns := find[corev1.Namespace](t, base, "Namespace")
	if _, err := c.AdminClient().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns.Name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", ns.Name, err)
	}

	applied := map[string]bool{}
	for _, set := range sets {
		for _, obj := range set.objs {
			gvk := obj.GroupVersionKind()
			id := fmt.Sprintf("%s %s %s/%s", set.dir, gvk.Kind, obj.GetNamespace(), obj.GetName())
			mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Errorf("%s: the API server does not serve this kind: %v", id, err)
				continue
			}
			var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
			if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
				if obj.GetNamespace() == "" {
					t.Errorf("%s: namespaced kind without a namespace", id)
					continue
				}
				ri = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
			} else if obj.GetNamespace() != "" {
				t.Errorf("%s: cluster-scoped kind with a namespace", id)
			}
			body, err := json.Marshal(obj.Object)
			if err != nil {
				t.Fatal(err)
			}
			force := true
			got, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{
				DryRun:          []string{metav1.DryRunAll},
				FieldManager:    "deploy-test",
				Force:           &force,
				FieldValidation: metav1.FieldValidationStrict,
			})
			if err != nil {
				t.Errorf("%s: server-side dry-run apply: %v", id, err)
				continue
			}
			applied[gvk.Kind] = true
			t.Logf("%s: valid (dry run)", id)
			// Nothing may have been stored, except the Namespace created above.
			if gvk.Kind != "Namespace" && gvk.Kind != "CustomResourceDefinition" {
				if _, err := ri.Get(ctx, got.GetName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					t.Errorf("%s: exists after a dry run (get: %v)", id, err)
				}
			}
		}
	}
	// Negative control: the same request with a misspelt field is refused,
	// so the passes above mean something.
	for _, obj := range base {
		if obj.GetKind() != "DaemonSet" {
			continue
		}
		bad := obj.DeepCopy()
		containers, _, _ := unstructured.NestedSlice(bad.Object, "spec", "template", "spec", "containers")
		containers[0].(map[string]any)["securityContex"] = map[string]any{"privileged": true}
		if err := unstructured.SetNestedSlice(bad.Object, containers, "spec", "template", "spec", "containers"); err != nil {
			t.Fatal(err)
		}
		body, _ := json.Marshal(bad.Object)
		force := true
		_, err := dyn.Resource(appsv1.SchemeGroupVersion.WithResource("daemonsets")).Namespace(bad.GetNamespace()).Patch(ctx, bad.GetName(),
			types.ApplyPatchType, body, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "deploy-test", Force: &force, FieldValidation: metav1.FieldValidationStrict})
		if err == nil || !strings.Contains(err.Error(), "securityContex") {
			t.Errorf("a DaemonSet with a misspelt field: got %v, want an unknown-field error", err)
		}
	}
	for _, kind := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "DaemonSet", "Service", "ServiceMonitor"} {
		if !applied[kind] {
			t.Errorf("no %s was validated", kind)
		}
	}
}

// unscopedWrites are the writes RBAC grants the agent that no admission
// policy narrows to its node, and why (none at the moment).
var unscopedWrites = map[string]string{}

// checkAdmissionPolicies checks the ValidatingAdmissionPolicies that narrow
// the agent's writes to its node (admissionpolicy.yaml): each is bound with
// the Deny action, fails closed, matches exactly the rendered
// ServiceAccount's user (its name is spelled out in CEL, which kustomize
// does not rewrite), refuses with 403 Forbidden (so that the e2e audit
// checks count refusals), and every write a ClusterRole grants is matched
// by one of them unless unscopedWrites says why not.
func checkAdmissionPolicies(t *testing.T, objs []*unstructured.Unstructured, sa *corev1.ServiceAccount) {
	t.Helper()
	user := "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
	policies := map[string]*admissionregistrationv1.ValidatingAdmissionPolicy{}
	bound, params := map[string]bool{}, map[string]bool{}
	var rules []rbacv1.PolicyRule
	for _, o := range objs {
		switch o.GetKind() {
		case "ValidatingAdmissionPolicy":
			p := &admissionregistrationv1.ValidatingAdmissionPolicy{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, p, true); err != nil {
				t.Fatalf("ValidatingAdmissionPolicy %s: %v", o.GetName(), err)
			}
			policies[p.Name] = p
		case "ValidatingAdmissionPolicyBinding":
			b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, b, true); err != nil {
				t.Fatalf("ValidatingAdmissionPolicyBinding %s: %v", o.GetName(), err)
			}
			if !slices.Equal(b.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
				t.Errorf("ValidatingAdmissionPolicyBinding %s: validationActions %v, want [Deny]", b.Name, b.Spec.ValidationActions)
			}
			if b.Spec.MatchResources != nil {
				t.Errorf("ValidatingAdmissionPolicyBinding %s narrows its policy; the policy alone should say what it matches", b.Name)
			}
			// Parameters come from a ConfigMap of the agent's namespace
			// that the kustomization renders; without it the policy
			// refuses (parameterNotFoundAction Deny).
			if r := b.Spec.ParamRef; r != nil {
				if r.Selector != nil || r.Namespace != sa.Namespace || r.ParameterNotFoundAction == nil ||
					*r.ParameterNotFoundAction != admissionregistrationv1.DenyAction ||
					!slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool {
						return o.GetKind() == "ConfigMap" && o.GetNamespace() == r.Namespace && o.GetName() == r.Name
					}) {
					t.Errorf("ValidatingAdmissionPolicyBinding %s: paramRef %+v is not a rendered ConfigMap of namespace %s, refused when missing", b.Name, r, sa.Namespace)
				}
				params[b.Spec.PolicyName] = true
			}
			bound[b.Spec.PolicyName] = true
		case "ClusterRole":
			r := &rbacv1.ClusterRole{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, r, true); err != nil {
				t.Fatalf("ClusterRole %s: %v", o.GetName(), err)
			}
			rules = append(rules, r.Rules...)
		}
		if strings.HasPrefix(o.GetKind(), "ValidatingAdmissionPolicy") && o.GetNamespace() != "" {
			t.Errorf("%s %s is cluster-scoped but has namespace %q", o.GetKind(), o.GetName(), o.GetNamespace())
		}
	}
	if len(policies) == 0 {
		t.Fatal("no ValidatingAdmissionPolicy: the agent's writes are not scoped to its node")
	}
	wantMatch := fmt.Sprintf("request.userInfo.username == '%s'", user)
	for name, p := range policies {
		if !bound[name] {
			t.Errorf("ValidatingAdmissionPolicy %s has no binding", name)
		}
		if pk := p.Spec.ParamKind; (pk != nil) != params[name] || pk != nil && (pk.APIVersion != "v1" || pk.Kind != "ConfigMap") {
			t.Errorf("ValidatingAdmissionPolicy %s: paramKind %+v, and its binding has paramRef: %v; want both or neither, of a ConfigMap", name, pk, params[name])
		}
		if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionregistrationv1.Fail {
			t.Errorf("ValidatingAdmissionPolicy %s: failurePolicy %v, want Fail", name, p.Spec.FailurePolicy)
		}
		if len(p.Spec.MatchConditions) != 1 || p.Spec.MatchConditions[0].Expression != wantMatch {
			t.Errorf("ValidatingAdmissionPolicy %s: matchConditions %+v, want exactly %q", name, p.Spec.MatchConditions, wantMatch)
		}
		if len(p.Spec.Validations) == 0 || !strings.Contains(p.Spec.Validations[0].Expression, "variables.nodeName != ''") {
			t.Errorf("ValidatingAdmissionPolicy %s does not first refuse a credential that names no node", name)
		}
		for i, v := range p.Spec.Validations {
			if v.Reason == nil || *v.Reason != metav1.StatusReasonForbidden {
				t.Errorf("ValidatingAdmissionPolicy %s: validation %d has reason %v, want Forbidden", name, i, v.Reason)
			}
		}
	}
	for name := range bound {
		if policies[name] == nil {
			t.Errorf("a binding names ValidatingAdmissionPolicy %s, which is not rendered", name)
		}
	}

	// Every granted write is matched by a policy.
	operation := map[string]admissionregistrationv1.OperationType{
		"create": admissionregistrationv1.Create, "update": admissionregistrationv1.Update,
		"patch": admissionregistrationv1.Update, "delete": admissionregistrationv1.Delete,
	}
	for _, rule := range rules {
		for _, verb := range rule.Verbs {
			op, write := operation[verb]
			if !write {
				continue
			}
			for _, group := range rule.APIGroups {
				for _, res := range rule.Resources {
					if _, ok := unscopedWrites[verb+" "+res]; ok {
						continue
					}
					if !slices.ContainsFunc(slices.Collect(maps.Values(policies)), func(p *admissionregistrationv1.ValidatingAdmissionPolicy) bool {
						return matches(p, group, res, op)
					}) {
						t.Errorf("RBAC grants %s %s (group %q), which no ValidatingAdmissionPolicy scopes to the agent's node", verb, res, group)
					}
				}
			}
		}
	}
}

// matches reports whether the policy's resource rules match an operation
// on group/resource (resource may name a subresource).
func matches(p *admissionregistrationv1.ValidatingAdmissionPolicy, group, resource string, op admissionregistrationv1.OperationType) bool {
	if p.Spec.MatchConstraints == nil {
		return false
	}
	for _, r := range p.Spec.MatchConstraints.ResourceRules {
		if (slices.Contains(r.APIGroups, group) || slices.Contains(r.APIGroups, "*")) &&
			(slices.Contains(r.Resources, resource) || slices.Contains(r.Resources, "*")) &&
			(slices.Contains(r.Operations, op) || slices.Contains(r.Operations, admissionregistrationv1.OperationAll)) {
			return true
		}
	}
	return false
}

// The local volume policy's parameters (deploy/local-volumes/policy-params.yaml)
// say, for each storage class of the provisioner's configuration
// (config.yaml), what its PVs may be: the same classes, discovery
// directories, volume modes, access modes, labels and fsTypes, and a
// maximum capacity. A class the policy does not know would have its PVs
// refused; one the configuration does not know would be a hole.
func TestLocalVolumePolicyParams(t *testing.T) {
	objs := render(t, "local-volumes")
	data := map[string]map[string]string{}
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" {
			cm := &corev1.ConfigMap{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, cm, true); err != nil {
				t.Fatal(err)
			}
			data[cm.Name] = cm.Data
		}
	}
	cfg, classErrs, err := localpv.ParseConfig("config.yaml", []byte(data["volume-agent-local-volumes"]["config.yaml"]))
	if err != nil || len(classErrs) > 0 || len(cfg.Classes) == 0 {
		t.Fatalf("deploy/local-volumes/config.yaml: %v %v, %d classes", err, classErrs, len(cfg.Classes))
	}
	params := data["volume-agent-local-volumes-policy"]
	want := map[string]string{}
	for name, c := range cfg.Classes {
		modes := make([]string, len(c.AccessModes))
		for i, m := range c.AccessModes {
			modes[i] = string(m)
		}
		labels := make([]string, 0, len(c.Labels))
		for k, v := range c.Labels {
			labels = append(labels, k+"="+v)
		}
		want[name+".discoveryDir"] = c.DiscoveryDir
		want[name+".volumeMode"] = string(c.VolumeMode)
		want[name+".accessModes"] = strings.Join(modes, ",")
		want[name+".labels"] = strings.Join(labels, ",")
		if c.FSType != "" {
			want[name+".fsType"] = c.FSType
		}
		max, ok := params[name+".maxCapacity"]
		if q, err := resource.ParseQuantity(max); !ok || err != nil || q.Sign() <= 0 {
			t.Errorf("policy-params.yaml: class %s: maxCapacity %q is not a positive quantity", name, max)
		}
		want[name+".maxCapacity"] = max
	}
	sorted := func(list string) string {
		return strings.Join(slices.Sorted(slices.Values(strings.Split(list, ","))), ",")
	}
	for k, v := range want {
		got, ok := params[k]
		if strings.HasSuffix(k, ".accessModes") || strings.HasSuffix(k, ".labels") {
			got, v = sorted(got), sorted(v)
		}
		if !ok || got != v {
			t.Errorf("policy-params.yaml: %s is %q, config.yaml says %q", k, params[k], v)
		}
	}
	for k := range params {
		if _, ok := want[k]; !ok {
			t.Errorf("policy-params.yaml: %s belongs to no class of config.yaml", k)
		}
	}
}
