// Package nodeidentity_test proves on a real kube-apiserver and
// kube-controller-manager that an agent on a node without a kubelet obtains
// an identity of its own the kubelet's way (--bootstrap-kubeconfig): a
// bootstrap token in group system:bootstrappers:volume-agent, the bindings
// of deploy/node-identity/bootstrap-rbac.yaml, a CertificateSigningRequest
// approved by the controller manager's approver and signed by its signer
// (certificates last 3 minutes here, --cluster-signing-duration), and that
// the agent then reads secrets as system:node:<name>, which the Node
// authorizer limits to its own pods' secrets; that a restart reuses the
// certificate on disk; and that the certificate is renewed, authenticated by
// itself, and the new one used once the old one has expired. The agent runs
// with the RBAC of deploy/node-identity, which grants no secret read.
//
// The tests need root (the agent mounts) and skip otherwise, in -short
// mode, with VOLUME_AGENT_SKIP_CLUSTER=1, or without the control-plane
// binaries.
package nodeidentity_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/volume-agent/volume-agent/internal/mounttest"
	"github.com/volume-agent/volume-agent/internal/nodecert"
	"github.com/volume-agent/volume-agent/test/cluster"
	"github.com/volume-agent/volume-agent/test/e2e/e2eutil"
)

var suite e2eutil.Suite

func TestMain(m *testing.M) {
	os.Exit(e2eutil.RunSuite(m, &suite, e2eutil.SuiteOptions{
		Name: "nodeidentity",
		ControlPlane: e2eutil.ControlPlaneOptions{
			Kustomization:    "deploy/node-identity",
			NodeCertificates: true,
			// Short-lived certificates are not backdated at their end:
			// NotBefore is 5 minutes back, NotAfter 3 minutes ahead, so
			// the agent renews between 36 s and 132 s after issue.
			ControllerManagerArgs: []string{"--cluster-signing-duration=3m"},
		},
		Setup:   setup,
		KeepDir: os.Getenv("VOLUME_AGENT_E2E_KEEP") != "",
	}))
}

const (
	tokenID     = "vagent"
	tokenSecret = "0123456789abcdef"
)

// setup creates what an operator creates once: the bootstrap RBAC and a
// bootstrap token in the agent's group.
func setup(ctx context.Context, s *e2eutil.Suite) error {
	root, err := cluster.RepoRoot()
	if err != nil {
		return err
	}
	f, err := os.Open(filepath.Join(root, "deploy/node-identity/bootstrap-rbac.yaml"))
	if err != nil {
		return err
	}
	defer f.Close()
	dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
	for n := 0; ; n++ {
		b := &rbacv1.ClusterRoleBinding{}
		if err := dec.Decode(b); errors.Is(err, io.EOF) {
			if n != 3 {
				return fmt.Errorf("bootstrap-rbac.yaml: %d bindings, want 3", n)
			}
			break
		} else if err != nil {
			return fmt.Errorf("bootstrap-rbac.yaml: %w", err)
		}
		if _, err := s.Admin.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	_, err = s.Admin.CoreV1().Secrets("kube-system").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + tokenID},
		Type:       corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			"token-id": tokenID, "token-secret": tokenSecret,
			"usage-bootstrap-authentication": "true",
			"auth-extra-groups":              "system:bootstrappers:volume-agent",
		},
	}, metav1.CreateOptions{})
	return err
}

// bootstrapKubeconfig writes a kubeconfig with the bootstrap token.
func bootstrapKubeconfig(t *testing.T) string {
	cfg := suite.Cluster.RESTConfig()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["bootstrap"] = &clientcmdapi.AuthInfo{Token: tokenID + "." + tokenSecret}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "bootstrap"}
	kc.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "bootstrap.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// issued returns the node's CSRs that were approved and signed, by
// requester.
func issued(ctx context.Context, node string) (map[string][]certificatesv1.CertificateSigningRequest, error) {
	list, err := suite.Admin.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string][]certificatesv1.CertificateSigningRequest{}
	for _, csr := range list.Items {
		approved := false
		for _, c := range csr.Status.Conditions {
			approved = approved || (c.Type == certificatesv1.CertificateApproved && c.Reason == "AutoApproved")
		}
		if !approved || len(csr.Status.Certificate) == 0 || csr.Spec.SignerName != certificatesv1.KubeAPIServerClientKubeletSignerName {
			continue
		}
		if leaf := parsePEM(csr.Status.Certificate); leaf == nil || leaf.Subject.CommonName != "system:node:"+node {
			continue
		}
		out[csr.Spec.Username] = append(out[csr.Spec.Username], csr)
	}
	return out, nil
}

// parsePEM parses the first certificate of PEM data; nil if there is none.
func parsePEM(data []byte) *x509.Certificate {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil
	}
	return leaf
}

// current reads the agent's certificate file.
func current(t *testing.T, dir string) (*x509.Certificate, []byte) {
	t.Helper()
	path := filepath.Join(dir, nodecert.FileName)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", path, fi.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.X509KeyPair(data, data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c.Leaf, data
}

// nodeClient authenticates with the agent's certificate file.
func nodeClient(t *testing.T, pair []byte) kubernetes.Interface {
	cfg := suite.Cluster.RESTConfig()
	c := &rest.Config{Host: cfg.Host, TLSClientConfig: rest.TLSClientConfig{CAData: cfg.CAData, CertData: pair, KeyData: pair}}
	return e2eutil.Must(t, func() (kubernetes.Interface, error) { return kubernetes.NewForConfig(c) })
}

func TestNodeIdentity(t *testing.T) {
	suite.Require(t)
	ctx := context.Background()
	node, other, ns := e2eutil.UniqueName("node"), e2eutil.UniqueName("other"), e2eutil.UniqueName("ns")
	suite.CreateNodeAndNamespace(t, node, ns, nil)
	if _, err := suite.Cluster.CreateNode(ctx, other, nil); err != nil {
		t.Fatal(err)
	}
	secret := func(name string) {
		t.Helper()
		if _, err := suite.Admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: map[string]string{"k": name},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	root := mounttest.TempDir(t)
	certDir := filepath.Join(t.TempDir(), "pki")
	for _, s := range []string{"mine", "theirs", "after-restart", "after-renewal"} {
		secret(s)
	}
	suite.CreatePod(t, e2eutil.Pod(ns, other, "theirs", secretVolume("theirs")))
	agent := suite.StartAgent(t, node, root, "--bootstrap-kubeconfig="+bootstrapKubeconfig(t), "--node-cert-dir="+certDir)

	// The first certificate: requested with the bootstrap token, approved
	// by the approver as a node client certificate, signed.
	var first certificatesv1.CertificateSigningRequest
	e2eutil.PollErr(t, time.Minute, "the bootstrap CSR approved and signed", func() error {
		byUser, err := issued(ctx, node)
		if err != nil {
			return err
		}
		if csrs := byUser["system:bootstrap:"+tokenID]; len(csrs) == 1 {
			first = csrs[0]
			return nil
		}
		return fmt.Errorf("issued CSRs by requester: %d", len(byUser))
	})
	issuedAt := time.Now()
	e2eutil.PollErr(t, 30*time.Second, "the certificate on disk", func() error {
		_, err := os.Stat(filepath.Join(certDir, nodecert.FileName))
		return err
	})
	leaf, pair := current(t, certDir)
	if want := parsePEM(first.Status.Certificate); want == nil || want.SerialNumber.Cmp(leaf.SerialNumber) != 0 {
		t.Fatalf("the certificate on disk (serial %v) is not the one CSR %s issued", leaf.SerialNumber, first.Name)
	}

	// The Node authorizer limits that identity to the node's own pods.
	pod := suite.CreatePod(t, e2eutil.Pod(ns, node, "mine", secretVolume("mine")))
	waitFile(t, root, pod, "mine")
	checkSecretReads(t, node, ns, "mine")
	asNode := nodeClient(t, pair)
	if _, err := asNode.CoreV1().Secrets(ns).Get(ctx, "theirs", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the node's certificate read a secret of a pod on another node: %v, want Forbidden", err)
	}
	if _, err := asNode.CoreV1().Secrets(ns).Get(ctx, "mine", metav1.GetOptions{}); err != nil {
		t.Errorf("the node's certificate cannot read its pod's secret: %v", err)
	}

	// A restart reuses the certificate: no new request. It renews at 36 s
	// after issue at the earliest, so only a restart within that proves it.
	if err := agent.Stop(); err != nil {
		t.Fatal(err)
	}
	agent.Start()
	pod = suite.CreatePod(t, e2eutil.Pod(ns, node, "after-restart", secretVolume("after-restart")))
	waitFile(t, root, pod, "after-restart")
	if after, _ := current(t, certDir); after.SerialNumber.Cmp(leaf.SerialNumber) != 0 {
		t.Errorf("after a restart the certificate is %v, want %v", after.SerialNumber, leaf.SerialNumber)
	}
	if elapsed := time.Since(issuedAt); elapsed < 30*time.Second {
		byUser, err := issued(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(byUser["system:node:"+node]) + len(byUser["system:bootstrap:"+tokenID]); n != 1 {
			t.Errorf("after a restart %d certificates issued for the node, want 1", n)
		}
	} else {
		t.Logf("restart took until %v after issue: not checking that no renewal was requested", elapsed)
	}

	// Renewal, authenticated by the current certificate (approved as the
	// node's own), before it expires; once the first has expired, the agent
	// still reads its pods' secrets: with the new one.
	e2eutil.PollErr(t, 3*time.Minute, "a renewal by the node, approved and signed", func() error {
		byUser, err := issued(ctx, node)
		if err != nil {
			return err
		}
		if len(byUser["system:node:"+node]) == 0 {
			return fmt.Errorf("no renewal yet")
		}
		return nil
	})
	var renewed *x509.Certificate
	e2eutil.PollErr(t, 30*time.Second, "the renewed certificate on disk", func() error {
		if renewed, _ = current(t, certDir); renewed.SerialNumber.Cmp(leaf.SerialNumber) == 0 {
			return fmt.Errorf("still serial %v", renewed.SerialNumber)
		}
		return nil
	})
	e2eutil.PollErr(t, 30*time.Second, "the expiration metric of the renewed certificate", func() error {
		v, err := agent.Metric("volume_agent_node_certificate_expiration_timestamp_seconds")
		if err == nil && int64(v) != renewed.NotAfter.Unix() {
			err = fmt.Errorf("%v, want %d", v, renewed.NotAfter.Unix())
		}
		return err
	})
	e2eutil.Poll(t, 4*time.Minute, "the first certificate expired", func(context.Context) (bool, string) {
		return time.Now().After(leaf.NotAfter.Add(time.Second)), "valid until " + leaf.NotAfter.String()
	})
	pod = suite.CreatePod(t, e2eutil.Pod(ns, node, "after-renewal", secretVolume("after-renewal")))
	waitFile(t, root, pod, "after-renewal")
	checkSecretReads(t, node, ns, "after-renewal")
}

// checkSecretReads checks in the audit log that the agent read the secret
// as the node, and read no secret with its service account.
func checkSecretReads(t *testing.T, node, ns, name string) {
	t.Helper()
	e2eutil.PollErr(t, 30*time.Second, "secret "+name+" read as system:node:"+node+" in the audit log", func() error {
		events, err := suite.Cluster.AuditEvents()
		if err != nil {
			return err
		}
		found := false
		for _, ev := range events {
			if ev.ObjectRef == nil || ev.ObjectRef.Resource != "secrets" || ev.ObjectRef.Namespace != ns {
				continue
			}
			if ev.User.Username == suite.User {
				t.Errorf("the agent's service account requested a secret: %s %s", ev.Verb, ev.RequestURI)
			}
			found = found || (ev.User.Username == "system:node:"+node && ev.ObjectRef.Name == name &&
				ev.ResponseStatus != nil && ev.ResponseStatus.Code == 200)
		}
		if !found {
			return fmt.Errorf("no successful read of secret %s by system:node:%s", name, node)
		}
		return nil
	})
}

func secretVolume(name string) corev1.Volume {
	return corev1.Volume{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: name}}}
}

// waitFile waits for the pod's secret volume to hold k=want.
func waitFile(t *testing.T, root string, pod *corev1.Pod, want string) {
	t.Helper()
	path := filepath.Join(e2eutil.VolumeDir(root, string(pod.UID), "kubernetes.io/secret", "s"), "k")
	e2eutil.PollErr(t, time.Minute, "secret "+want+" in pod "+pod.Name, func() error {
		got, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if string(got) != want {
			return fmt.Errorf("%s holds %q", path, got)
		}
		return nil
	})
}
