// Package cluster runs a real Kubernetes control plane for integration tests
// and for `make cluster-up`: etcd, kube-apiserver and optionally
// kube-controller-manager, all on 127.0.0.1 with random ports and a private
// directory for data, credentials, kubeconfigs and logs.
//
// There is no kubelet and no scheduler. Tests create Nodes themselves (see
// CreateNode), set spec.nodeName on Pods, and act on the node's behalf with a
// node token (see Options.Nodes and NodeKubeconfig), as volume-agent does.
//
// The binaries come from test/tools/build.sh (see ToolsBin). Every request the
// apiserver serves is written to an audit log, so tests can count requests by
// user agent, user, verb and resource (see AuditEvents); the apiserver's own
// metrics have no user-agent label.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// DefaultControllers are the kube-controller-manager controllers that volume
// tests need. node-lifecycle-controller is left out on purpose: Nodes created
// by tests never post status, and it would taint them unreachable.
var DefaultControllers = []string{
	"serviceaccount-controller",
	"serviceaccount-token-controller",
	"persistentvolume-binder-controller",
	"persistentvolume-protection-controller",
	"persistentvolumeclaim-protection-controller",
	"ephemeral-volume-controller",
	"garbage-collector-controller",
	"namespace-controller",
	"root-ca-certificate-publisher-controller",
}

// Controllers that DefaultControllers leave out, for the suites that want
// them (Options.Controllers), by their names in kube-controller-manager
// 1.36 (cmd/kube-controller-manager/names): the attach/detach controller
// creates and deletes the VolumeAttachments of the pods on the nodes that
// carry the volumes.kubernetes.io/controller-managed-attach-detach
// annotation; the expander hands a grown claim of a CSI volume to its
// driver's external-resizer.
const (
	AttachDetachController = "persistentvolume-attach-detach-controller"
	ExpanderController     = "persistentvolume-expander-controller"
)

// Options configure Start. The zero value starts etcd and kube-apiserver only.
type Options struct {
	// ControllerManager also starts kube-controller-manager.
	ControllerManager bool
	// Controllers replaces DefaultControllers.
	Controllers []string
	// Nodes are the node names that get a static token for user
	// system:node:<name> in group system:nodes. The apiserver reads its token
	// file only at start, so they must be known up front. The Node objects are
	// not created; see CreateNode.
	Nodes []string
	// Dir holds data, credentials, kubeconfigs and logs. If empty, Start makes
	// a temporary directory and Stop removes it; a given Dir is kept.
	Dir string
	// APIServerArgs and ControllerManagerArgs are appended to the flags this
	// package passes, for example to set feature gates.
	APIServerArgs         []string
	ControllerManagerArgs []string
	// NodeCertificates lets nodes obtain client certificates the
	// kubelet's way: the apiserver accepts bootstrap tokens and client
	// certificates of the cluster's CA, and the controller manager also
	// runs CSRControllers, signing with that CA (for
	// --cluster-signing-duration, see ControllerManagerArgs).
	NodeCertificates bool
}

// CSRControllers approve, sign and clean up CertificateSigningRequests
// (Options.NodeCertificates adds them).
var CSRControllers = []string{
	"certificatesigningrequest-signing-controller",
	"certificatesigningrequest-approving-controller",
	"certificatesigningrequest-cleaner-controller",
}

// Cluster is a running control plane. Its methods are safe for concurrent use.
type Cluster struct {
	opts       Options
	dir        string
	ownsDir    bool
	bin        string
	pki        *pki
	etcdURL    string
	apiPort    int
	adminToken string
	nodeTokens map[string]string
	restConfig *rest.Config
	client     kubernetes.Interface

	mu        sync.Mutex // guards the processes and stopped
	etcd      *process
	apiserver *process
	kcm       *process
	stopped   bool
}

// Start starts the control plane and returns once the apiserver is ready, the
// default namespace exists and, with the controller manager, the default
// ServiceAccount exists (Pods cannot be created before that). ctx bounds only
// the start-up; the processes run until Stop.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	for _, n := range opts.Nodes {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			return nil, fmt.Errorf("node name %q: %s", n, strings.Join(errs, "; "))
		}
	}
	bin, err := ToolsBin()
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, bin: bin, dir: opts.Dir, adminToken: randomToken(), nodeTokens: map[string]string{}}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "volume-agent-cluster-"); err != nil {
			return nil, err
		}
		c.ownsDir = true
	} else if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()

	kcmToken := randomToken()
	users := []staticUser{
		{token: c.adminToken, name: "admin", groups: []string{"system:masters"}},
		// The built-in RBAC rules grant this user what the controller manager
		// needs to create the per-controller service accounts it then uses.
		{token: kcmToken, name: "system:kube-controller-manager"},
	}
	for _, n := range opts.Nodes {
		c.nodeTokens[n] = randomToken()
		users = append(users, staticUser{token: c.nodeTokens[n], name: "system:node:" + n, groups: []string{"system:nodes"}})
	}
	if c.pki, err = writePKI(c.path("pki"), users); err != nil {
		return nil, fmt.Errorf("write credentials: %w", err)
	}
	if err := os.WriteFile(c.path("audit-policy.yaml"), []byte(auditPolicy), 0o644); err != nil {
		return nil, err
	}

	if err := retryOnPortClash(func() error { return c.startEtcd(ctx) }); err != nil {
		return nil, err
	}
	if err := retryOnPortClash(func() error {
		ports, err := freePorts(1)
		if err != nil {
			return err
		}
		c.apiPort = ports[0]
		c.restConfig = c.tokenConfig(c.adminToken)
		if c.client, err = kubernetes.NewForConfig(c.restConfig); err != nil {
			return err
		}
		return c.startAPIServer(ctx)
	}); err != nil {
		return nil, err
	}

	if err := c.writeKubeconfigs(kcmToken); err != nil {
		return nil, err
	}
	if err := c.apiserver.waitUntil(ctx, time.Minute, "namespace default", func(ctx context.Context) error {
		_, err := c.client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		return nil, err
	}
	if opts.ControllerManager {
		if err := c.startControllerManager(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *Cluster) path(name string) string { return filepath.Join(c.dir, name) }

func (c *Cluster) startEtcd(ctx context.Context) error {
	// A failed attempt may have left a member with other peer URLs behind.
	c.etcd.stop()
	if err := os.RemoveAll(c.path("etcd-data")); err != nil {
		return err
	}
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	c.etcdURL = "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	p, err := startProcess("etcd", filepath.Join(c.bin, "etcd"), []string{
		"--name=volume-agent-test",
		"--data-dir=" + c.path("etcd-data"),
		"--listen-client-urls=" + c.etcdURL,
		"--advertise-client-urls=" + c.etcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=volume-agent-test=" + peerURL,
		"--unsafe-no-fsync", // test data need not survive a power cut
		"--log-level=warn",
	}, c.path("etcd.log"))
	if err != nil {
		return err
	}
	c.etcd = p
	return p.waitUntil(ctx, 30*time.Second, "etcd /health", func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.etcdURL+"/health", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	})
}

// startAPIServer starts kube-apiserver on c.apiPort and waits for /readyz.
// Restarts use the same port, etcd and credentials, so clients and
// kubeconfigs stay valid.
func (c *Cluster) startAPIServer(ctx context.Context) error {
	c.apiserver.stop() // from a failed attempt
	args := []string{
		"--etcd-servers=" + c.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(c.apiPort),
		"--tls-cert-file=" + c.pki.servingCert,
		"--tls-private-key-file=" + c.pki.servingKey,
		"--cert-dir=" + c.path("pki"), // unused with the files above, but keeps the default /var/run/kubernetes untouched
		"--token-auth-file=" + c.pki.tokens,
		"--service-account-key-file=" + c.pki.saPub,
		"--service-account-signing-key-file=" + c.pki.saKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--authorization-mode=Node,RBAC",
		// Not on by default, but every real cluster has it; it limits what a
		// node identity may write, which is exactly what volume-agent runs as.
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--service-cluster-ip-range=10.0.0.0/24",
		// The endpoint reconciler rejects the loopback advertise address and
		// logs an error every 10 s; nothing here needs the endpoints.
		"--endpoint-reconciler-type=none",
		// Otherwise a graceful stop waits up to the 60 s request timeout for
		// open watches (the controller manager's) before it exits.
		"--shutdown-send-retry-after=true",
		"--audit-policy-file=" + c.path("audit-policy.yaml"),
		"--audit-log-path=" + c.auditLogPath(),
	}
	if c.opts.NodeCertificates {
		args = append(args, "--client-ca-file="+c.pki.caCert, "--enable-bootstrap-token-auth")
	}
	p, err := startProcess("kube-apiserver", filepath.Join(c.bin, "kube-apiserver"), append(args, c.opts.APIServerArgs...), c.path("kube-apiserver.log"))
	if err != nil {
		return err
	}
	c.apiserver = p
	return p.waitUntil(ctx, 2*time.Minute, "/readyz", func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		body, err := c.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return err
		}
		if string(body) != "ok" {
			return fmt.Errorf("/readyz: %s", body)
		}
		return nil
	})
}

func (c *Cluster) startControllerManager(ctx context.Context) error {
	controllers := c.opts.Controllers
	if len(controllers) == 0 {
		controllers = DefaultControllers
	}
	if c.opts.NodeCertificates {
		controllers = append(slices.Clone(controllers), CSRControllers...)
	}
	args := []string{
		"--kubeconfig=" + c.path("kube-controller-manager.kubeconfig"),
		"--controllers=" + strings.Join(controllers, ","),
		"--use-service-account-credentials=true",
		"--leader-elect=false",
		"--secure-port=0",
		"--service-account-private-key-file=" + c.pki.saKey,
		"--root-ca-file=" + c.pki.caCert,
		// The default 15 s makes a claim created before the controller
		// started wait a full resync before it binds.
		"--pvclaimbinder-sync-period=1s",
		// Otherwise it creates /usr/libexec/kubernetes/kubelet-plugins on the host.
		"--flex-volume-plugin-dir=" + c.path("flexvolume"),
	}
	if c.opts.NodeCertificates {
		args = append(args, "--cluster-signing-cert-file="+c.pki.caCert, "--cluster-signing-key-file="+c.pki.caKey)
	}
	p, err := startProcess("kube-controller-manager", filepath.Join(c.bin, "kube-controller-manager"), append(args, c.opts.ControllerManagerArgs...), c.path("kube-controller-manager.log"))
	if err != nil {
		return err
	}
	c.kcm = p
	if !slices.Contains(controllers, "serviceaccount-controller") {
		return nil
	}
	return p.waitUntil(ctx, time.Minute, "serviceaccount default/default", func(ctx context.Context) error {
		_, err := c.client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

func (c *Cluster) writeKubeconfigs(kcmToken string) error {
	if err := writeKubeconfig(c.AdminKubeconfig(), c.APIServerURL(), c.pki.caPEM, "admin", c.adminToken); err != nil {
		return err
	}
	if err := writeKubeconfig(c.path("kube-controller-manager.kubeconfig"), c.APIServerURL(), c.pki.caPEM, "system:kube-controller-manager", kcmToken); err != nil {
		return err
	}
	for n, token := range c.nodeTokens {
		if err := writeKubeconfig(c.NodeKubeconfig(n), c.APIServerURL(), c.pki.caPEM, "system:node:"+n, token); err != nil {
			return err
		}
	}
	return nil
}

// tokenConfig is a client configuration for a bearer token that verifies the
// apiserver's certificate. Rate limits are raised so that tests are not
// throttled on the client side.
func (c *Cluster) tokenConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            c.APIServerURL(),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.pki.caPEM},
		QPS:             200,
		Burst:           400,
	}
}

// Dir is the directory with data, credentials, kubeconfigs and the logs
// (etcd.log, kube-apiserver.log, kube-controller-manager.log, audit.log).
func (c *Cluster) Dir() string { return c.dir }

// APIServerURL is the apiserver's https URL on 127.0.0.1.
func (c *Cluster) APIServerURL() string { return "https://127.0.0.1:" + strconv.Itoa(c.apiPort) }

// AdminKubeconfig is the path of a kubeconfig for a system:masters user.
func (c *Cluster) AdminKubeconfig() string { return c.path("admin.kubeconfig") }

// RESTConfig returns a copy of the admin client configuration.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.restConfig) }

// AdminClient is a client for a system:masters user.
func (c *Cluster) AdminClient() kubernetes.Interface { return c.client }

// NodeKubeconfig is the path of a kubeconfig for user system:node:<nodeName>
// in group system:nodes. It panics unless nodeName was in Options.Nodes.
func (c *Cluster) NodeKubeconfig(nodeName string) string {
	if _, ok := c.nodeTokens[nodeName]; !ok {
		panic(fmt.Sprintf("cluster: node %q was not in Options.Nodes", nodeName))
	}
	return c.path("node-" + nodeName + ".kubeconfig")
}

// ServiceAccountKubeconfig creates the ServiceAccount namespace/name unless it
// exists, requests a token for it with the TokenRequest API, and writes a
// kubeconfig with that token. The token is valid for 24 hours. The namespace
// must exist.
func (c *Cluster) ServiceAccountKubeconfig(ctx context.Context, namespace, name string) (string, error) {
	sas := c.client.CoreV1().ServiceAccounts(namespace)
	_, err := sas.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	expiration := int64(24 * time.Hour / time.Second)
	tr, err := sas.CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiration},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	path := c.path("sa-" + namespace + "-" + name + ".kubeconfig")
	user := "system:serviceaccount:" + namespace + ":" + name
	return path, writeKubeconfig(path, c.APIServerURL(), c.pki.caPEM, user, tr.Status.Token)
}

// PodTokenKubeconfig writes a kubeconfig with a token of the pod's
// ServiceAccount bound to the pod, as the kubelet projects it into the pod:
// the API server adds the pod's name and its node's name and UID to the
// user's extra fields (authentication.kubernetes.io/node-name...), and the
// token dies with the pod. The pod must exist and be bound to a node that
// exists. The token is valid for 24 hours.
func (c *Cluster) PodTokenKubeconfig(ctx context.Context, pod *corev1.Pod) (string, error) {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	expiration := int64(24 * time.Hour / time.Second)
	tr, err := c.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &expiration,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	path := c.path("pod-" + pod.Namespace + "-" + pod.Name + ".kubeconfig")
	user := "system:serviceaccount:" + pod.Namespace + ":" + sa
	return path, writeKubeconfig(path, c.APIServerURL(), c.pki.caPEM, user, tr.Status.Token)
}

// CreateNode creates a Node with the given labels plus kubernetes.io/hostname,
// which the kubelet would set and node-affinity rules of local volumes use.
func (c *Cluster) CreateNode(ctx context.Context, name string, labels map[string]string) (*corev1.Node, error) {
	all := map[string]string{corev1.LabelHostname: name}
	for k, v := range labels {
		all[k] = v
	}
	return c.client.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: all},
	}, metav1.CreateOptions{})
}

// Metrics returns the apiserver's /metrics in the Prometheus text format.
func (c *Cluster) Metrics(ctx context.Context) (string, error) {
	body, err := c.client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	return string(body), err
}

// PIDs returns the process IDs of the components started last, by binary name.
func (c *Cluster) PIDs() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	pids := map[string]int{}
	for _, p := range []*process{c.etcd, c.apiserver, c.kcm} {
		if p != nil {
			pids[p.name] = p.pid
		}
	}
	return pids
}

// StopAPIServer stops kube-apiserver and waits for it to exit, for tests of
// API outages. etcd and the controller manager keep running.
func (c *Cluster) StopAPIServer() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.apiserver.stop()
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the same
// port and with the same etcd, and waits until it is ready.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return errors.New("cluster: stopped")
	}
	if !c.apiserver.exited() {
		return errors.New("cluster: kube-apiserver is running")
	}
	return c.startAPIServer(ctx)
}

// Stop stops the controller manager, then the apiserver, then etcd, each with
// SIGTERM and after a grace period SIGKILL, and waits for each to exit. The
// apiserver must be gone before etcd stops, or it hangs in shutdown. Stop
// removes the directory if Start created it. Calling it again does nothing.
func (c *Cluster) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	c.stopped = true
	for _, p := range []*process{c.kcm, c.apiserver, c.etcd} {
		p.stop()
	}
	if c.ownsDir {
		_ = os.RemoveAll(c.dir)
	}
}

// logTails returns the end of each component's log, for test failures.
func (c *Cluster) logTails() string {
	var b strings.Builder
	for _, name := range toolBinaries {
		path := c.path(name + ".log")
		if _, err := os.Stat(path); err == nil {
			fmt.Fprintf(&b, "--- last lines of %s ---\n%s\n", path, logTail(path, 40))
		}
	}
	return b.String()
}

// freePorts returns n distinct TCP ports on 127.0.0.1 that were free a moment
// ago. Another process may take one before the component binds it; Start
// retries then.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close() // only after all are chosen, so they differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func retryOnPortClash(start func() error) error {
	var err error
	for range 3 {
		if err = start(); err == nil || !strings.Contains(err.Error(), "address already in use") {
			return err
		}
	}
	return err
}
