package e2eutil

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/volume-agent/volume-agent/test/cluster"
)

// ControlPlaneOptions configure StartControlPlane.
type ControlPlaneOptions struct {
	// Dir is the control plane's directory (data, logs, audit.log).
	Dir string
	// Kustomization is the directory, relative to the repository, whose
	// RBAC objects the agents run with: "deploy/cluster-read" (the
	// default: the agents of most tests have no node credentials, so
	// their ServiceAccount reads what API volumes need) or another
	// overlay such as "deploy/self-attach".
	Kustomization string
	// Allowed is what the agent's ServiceAccount must be allowed, besides
	// watching pods, before StartControlPlane returns.
	Allowed []authorizationv1.ResourceAttributes
	// Nodes get credentials of their own (system:node:<name> in group
	// system:nodes, see cluster.Options.Nodes), for agents run with the
	// node's identity (--node-kubeconfig).
	Nodes []string
	// APIServerArgs are added to kube-apiserver's flags (feature gates).
	APIServerArgs []string
	// Controllers replaces cluster.DefaultControllers (a benchmark binds
	// thousands of claims itself, without the binder's resyncs; the
	// nokubelet suite adds cluster.AttachDetachController and
	// cluster.ExpanderController).
	Controllers []string
	// AdmissionPolicies also creates the kustomization's
	// ValidatingAdmissionPolicies and their bindings. They refuse every
	// write of an agent whose token is not bound to a pod on a node
	// (Kubeconfig's is not; see PodTokenKubeconfig), so only suites that
	// run agents with pod-bound tokens set it.
	AdmissionPolicies bool
	// NodeCertificates and ControllerManagerArgs: see cluster.Options.
	NodeCertificates      bool
	ControllerManagerArgs []string
}

// ControlPlane is a running etcd, kube-apiserver and
// kube-controller-manager (PV binder, ephemeral-volume controller, garbage
// collector...) with the Namespace, ServiceAccount, ClusterRoles and
// ClusterRoleBindings that a deploy/ kustomization renders (not the
// DaemonSet: the tests run the agent as a process). Agents run as that
// ServiceAccount, never as an administrator.
type ControlPlane struct {
	Cluster *cluster.Cluster
	// Admin is a client of a system:masters user.
	Admin kubernetes.Interface
	// ServiceAccount is the agent's; Kubeconfig holds a token of it and
	// User is its user name (system:serviceaccount:<ns>:<name>).
	ServiceAccount *corev1.ServiceAccount
	Kubeconfig     string
	User           string
	// ClusterRoles are the kustomization's.
	ClusterRoles []*rbacv1.ClusterRole
	// AdmissionPolicies says that the kustomization's admission policies
	// are in force (ControlPlaneOptions.AdmissionPolicies).
	AdmissionPolicies bool
}

// StartControlPlane starts a control plane and creates the kustomization's
// RBAC objects. It returns once the RBAC authorizer (which learns about
// bindings through a watch) allows the ServiceAccount to watch pods and
// everything in Allowed. On error nothing is left running.
func StartControlPlane(ctx context.Context, o ControlPlaneOptions) (_ *ControlPlane, err error) {
	if o.Kustomization == "" {
		o.Kustomization = "deploy/cluster-read"
	}
	root, err := cluster.RepoRoot()
	if err != nil {
		return nil, err
	}
	objs, err := RenderKustomization(filepath.Join(root, o.Kustomization))
	if err != nil {
		return nil, err
	}
	c, err := cluster.Start(ctx, cluster.Options{ControllerManager: true, Dir: o.Dir, Nodes: o.Nodes, APIServerArgs: o.APIServerArgs,
		Controllers: o.Controllers, NodeCertificates: o.NodeCertificates, ControllerManagerArgs: o.ControllerManagerArgs})
	if err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	cp := &ControlPlane{Cluster: c, Admin: c.AdminClient(), AdmissionPolicies: o.AdmissionPolicies}
	if err := cp.create(ctx, objs, o.AdmissionPolicies); err != nil {
		return nil, fmt.Errorf("%s: %w", o.Kustomization, err)
	}
	if cp.ServiceAccount == nil || len(cp.ClusterRoles) == 0 {
		return nil, fmt.Errorf("%s renders no ServiceAccount or no ClusterRole", o.Kustomization)
	}
	sa := cp.ServiceAccount
	if cp.Kubeconfig, err = c.ServiceAccountKubeconfig(ctx, sa.Namespace, sa.Name); err != nil {
		return nil, err
	}
	cp.User = "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
	allowed := append([]authorizationv1.ResourceAttributes{{Verb: "watch", Resource: "pods"}}, o.Allowed...)
	if err := cp.WaitAllowed(ctx, sa.Namespace, sa.Name, allowed...); err != nil {
		return nil, err
	}
	return cp, nil
}

// ApplyKustomization creates the RBAC objects (and, with policies, the
// admission policies) that the kustomization directory (relative to the
// repository) renders, skipping those that exist already: for a suite that
// needs an overlay besides its own (deploy/self-attach...). The ClusterRoles
// are added to ClusterRoles.
func (cp *ControlPlane) ApplyKustomization(ctx context.Context, dir string, policies bool) error {
	root, err := cluster.RepoRoot()
	if err != nil {
		return err
	}
	objs, err := RenderKustomization(filepath.Join(root, dir))
	if err != nil {
		return err
	}
	if err := cp.create(ctx, objs, policies); err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	return nil
}

// create creates the Namespace, ServiceAccount, ClusterRoles and
// ClusterRoleBindings among objs, and with policies the
// ValidatingAdmissionPolicies and their bindings; objects that exist are
// left as they are.
func (cp *ControlPlane) create(ctx context.Context, objs []*unstructured.Unstructured, policies bool) error {
	for _, obj := range objs {
		var err error
		switch obj.GetKind() {
		case "Namespace":
			ns := &corev1.Namespace{}
			if err = FromUnstructured(obj, ns); err == nil {
				_, err = cp.Admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
			}
		case "ServiceAccount":
			sa := &corev1.ServiceAccount{}
			if err = FromUnstructured(obj, sa); err == nil {
				cp.ServiceAccount = sa
				_, err = cp.Admin.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{})
			}
		case "ClusterRole":
			r := &rbacv1.ClusterRole{}
			if err = FromUnstructured(obj, r); err == nil {
				if _, err = cp.Admin.RbacV1().ClusterRoles().Create(ctx, r, metav1.CreateOptions{}); err == nil {
					cp.ClusterRoles = append(cp.ClusterRoles, r)
				}
			}
		case "ClusterRoleBinding":
			b := &rbacv1.ClusterRoleBinding{}
			if err = FromUnstructured(obj, b); err == nil {
				_, err = cp.Admin.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{})
			}
		case "ValidatingAdmissionPolicy":
			if !policies {
				continue
			}
			p := &admissionregistrationv1.ValidatingAdmissionPolicy{}
			if err = FromUnstructured(obj, p); err == nil {
				_, err = cp.Admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, p, metav1.CreateOptions{})
			}
		case "ValidatingAdmissionPolicyBinding":
			if !policies {
				continue
			}
			b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			if err = FromUnstructured(obj, b); err == nil {
				_, err = cp.Admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, b, metav1.CreateOptions{})
			}
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
	}
	return nil
}

// WaitAllowed asks the RBAC authorizer (as the administrator, so that the
// ServiceAccount has no request refused) until it allows the
// ServiceAccount namespace/name everything in attrs, for at most 30 s.
// New bindings reach it through a watch.
func (cp *ControlPlane) WaitAllowed(ctx context.Context, namespace, name string, attrs ...authorizationv1.ResourceAttributes) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	user := "system:serviceaccount:" + namespace + ":" + name
	for _, attr := range attrs {
		for {
			review, err := cp.Admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{
					User:               user,
					Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
					ResourceAttributes: &attr,
				},
			}, metav1.CreateOptions{})
			if err == nil && review.Status.Allowed {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("the RBAC bindings never allowed %s to %s %s/%s (review: %+v, error: %v)", user, attr.Verb, attr.Resource, attr.Subresource, review, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// RenderKustomization builds a kustomization directory, as
// `kubectl apply -k` would.
func RenderKustomization(dir string) ([]*unstructured.Unstructured, error) {
	resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, r := range resMap.Resources() {
		data, err := r.MarshalJSON()
		if err != nil {
			return nil, err
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(data); err != nil {
			return nil, err
		}
		out = append(out, obj)
	}
	return out, nil
}

// FromUnstructured converts a rendered object into a typed one, refusing
// unknown fields.
func FromUnstructured(u *unstructured.Unstructured, into any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true)
}
