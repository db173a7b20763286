package agent

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/volume-agent/volume-agent/agent/debug"
	"github.com/volume-agent/volume-agent/internal/kubeclient"
	"github.com/volume-agent/volume-agent/internal/notify"
	"github.com/volume-agent/volume-agent/plugins"
	"github.com/volume-agent/volume-agent/plugins/apivolume"
	"github.com/volume-agent/volume-agent/plugins/apivolume/budget"
	csiplugin "github.com/volume-agent/volume-agent/plugins/csi"
	"github.com/volume-agent/volume-agent/podcerts"
	"github.com/volume-agent/volume-agent/populator"
	"github.com/volume-agent/volume-agent/refresh"
	"github.com/volume-agent/volume-agent/source/apiobjects"
	"github.com/volume-agent/volume-agent/source/manifest"
	"github.com/volume-agent/volume-agent/source/objectwatch"
	"github.com/volume-agent/volume-agent/tokens"
)

// apiVolumes serves configMap, secret, downwardAPI and projected volumes
// and keeps them current.
type apiVolumes struct {
	plugins []plugins.Plugin
	status  *apivolume.Status
	refresh *refresh.Refresher
	// objects and tokens exist in cluster mode only.
	objects *apiobjects.Cluster
	tokens  *tokens.Manager
	// certs and certWatch exist with the node's identity only.
	certs     *podcerts.Manager
	certWatch *podcerts.Watch
	// credentials says whose credentials read secrets and request tokens.
	credentials string
	budget      *budget.Budget
	// env are the ConfigMaps and Secrets that containers' subPathExpr
	// read, from the same watches (or manifests) as the volumes';
	// envChanged fires when one changes or is read.
	env         populator.EnvObjects
	envChanged  *notify.Signal
	allocatable func() v1.ResourceList
}

// newAPIVolumes builds the plugins and what feeds them: in standalone mode
// the manifest directory (no tokens: there is no API server), in cluster
// mode per-object watches and TokenRequests, made with the node's own
// credentials when cfg.NodeKubeconfig is set. The refresher gives pod
// volumes new content generations in dsw. obs gets the refreshes' and the
// token requests' figures.
func newAPIVolumes(cfg Config, host plugins.Host, m *mode, dsw refresh.Desired, obs apiVolumesObserver) *apiVolumes {
	log := cfg.Log
	a := &apiVolumes{envChanged: notify.New()}
	a.budget = budget.New(budget.Limits{Pod: max(0, cfg.APIVolumePodBytes), Node: max(0, cfg.APIVolumeNodeBytes)}, obs)
	src := apivolume.Sources{
		Budget:               a.budget,
		NoTokensReason:       noTokensReason + " (set automountServiceAccountToken: false, or remove the projection)",
		NoTrustBundlesReason: "clusterTrustBundle projections need an API server, and this agent runs in standalone mode",
		NoPodCertsReason:     "podCertificate projections need an API server, and this agent runs in standalone mode",
	}
	ropts := refresh.Options{Desired: dsw, Observer: obs, Log: log.Named("refresh")}
	// The refresher is told about changes; it is built last, from the
	// parts below.
	var onChange func(kind, ns, name string)
	changed := func(kind, ns, name string) {
		onChange(kind, ns, name)
		a.envChanged.Notify()
	}
	if c := m.cluster; c == nil {
		ms := m.manifest
		src.Objects = apiobjects.Manifest{Store: ms}
		a.env = ms
		src.NodeAllocatable = hostAllocatable(cfg.RootDir)
		ms.OnObjectChange(changed)
		a.credentials = "none (standalone mode)"
	} else {
		a.credentials = "the agent's own (its ServiceAccount)"
		if c.nodeClient != nil {
			a.credentials = "the node's (" + cfg.NodeKubeconfig + ")"
			if c.nodeCert != nil {
				a.credentials = "the node's own certificate (" + cfg.NodeCertDir + ")"
			}
		}
		client := c.objectsClient()
		a.objects = apiobjects.NewCluster(apiobjects.ClusterOptions{Client: client, OnChange: changed, Limiter: c.listing, Log: log.Named("objects"),
			OnRead: func(string, string, string) { a.envChanged.Notify() }})
		a.env = clusterEnvObjects{a.objects}
		a.tokens = tokens.New(tokens.Options{Requester: client, Observer: obs})
		src.Objects, src.Tokens, src.TrustBundles = a.objects, a.tokens, a.objects
		src.NodeAllocatable = func() v1.ResourceList {
			if n, ok := c.source.Node(); ok {
				return n.Status.Allocatable
			}
			return nil
		}
		ropts.Watches, ropts.Tokens = a.objects, a.tokens
		if c.nodeClient != nil {
			// Only with the node's identity: the Node authorizer and
			// NodeRestriction then limit the requests to the node's pods.
			nc := c.nodeClient
			a.certWatch = podcerts.NewWatch(podcerts.WatchOptions{Client: nc, NodeName: cfg.NodeName,
				ListWatch: func(sel fields.Selector) cache.ListerWatcher {
					return kubeclient.ListWatch(nc.Certificates, "podcertificaterequests", "", sel)
				},
				OnChange: func(pod types.UID) { changed(refresh.KindPodCertificateRequest, "", string(pod)) }})
			a.certs = podcerts.New(podcerts.Options{Creator: nc, Lookup: a.certWatch, Node: func() (string, types.UID, bool) {
				if n, ok := c.source.Node(); ok {
					return n.Name, n.UID, true
				}
				return "", "", false
			}})
			src.PodCerts, ropts.PodCerts = a.certs, a.certs
		} else {
			src.NoPodCertsReason = "podCertificate projections are requested with the node's identity (--node-kubeconfig or --bootstrap-kubeconfig), which the Node authorizer and NodeRestriction limit to the node's pods, and this agent runs with its ServiceAccount only"
		}
	}
	a.allocatable = src.NodeAllocatable
	a.refresh = refresh.New(ropts)
	onChange = a.refresh.ObjectChanged
	src.Pods = a.refresh
	a.plugins, a.status = apivolume.New(host, src)
	log.Info("API volumes: configMap, secret, downwardAPI, projected", zap.String("credentials", a.credentials),
		zap.Int64("podBudgetBytes", a.budget.Limits().Pod), zap.Int64("nodeBudgetBytes", a.budget.Limits().Node))
	return a
}

// clusterEnvObjects reads subPathExpr's objects from the API volumes'
// watches, never waiting.
type clusterEnvObjects struct{ c *apiobjects.Cluster }

func (o clusterEnvObjects) ConfigMap(ns, name string) (*v1.ConfigMap, error) {
	return o.c.CachedConfigMap(ns, name)
}

func (o clusterEnvObjects) Secret(ns, name string) (*v1.Secret, error) {
	return o.c.CachedSecret(ns, name)
}

// manifestObjects are the ConfigMaps and Secrets of standalone mode's
// manifest directory, and their changes.
type manifestObjects interface {
	ConfigMap(namespace, name string) (*v1.ConfigMap, error)
	Secret(namespace, name string) (*v1.Secret, error)
	OnObjectChange(f manifest.ObjectChanged)
}

var _ manifestObjects = (*manifest.Source)(nil)

// apiVolumesObserver gets the refreshes', the token requests' and the
// budget refusals' figures (the metrics).
type apiVolumesObserver interface {
	refresh.Observer
	tokens.Observer
	budget.Observer
}

// noTokensReason says why standalone mode has no service-account tokens,
// in the error of every volume that needs one.
const noTokensReason = "service-account tokens need an API server, and this agent runs in standalone mode"

// tokenIssuer is the token cache for other plugins (CSI tokenRequests), nil
// in standalone mode.
func (a *apiVolumes) tokenIssuer() csiplugin.TokenIssuer {
	if a.tokens == nil {
		return nil
	}
	return a.tokens
}

func (a *apiVolumes) stop() {
	if a.objects != nil {
		a.objects.Stop()
	}
	if a.certWatch != nil {
		a.certWatch.Stop()
	}
}

func (a *apiVolumes) document() debug.APIVolumesDocument {
	d := debug.APIVolumesDocument{Credentials: a.credentials, Volumes: a.status.List(), Refresh: a.refresh.Stats(),
		Watches: []objectwatch.KeyStatus{}, Tokens: []tokens.Status{}}
	if a.objects != nil {
		d.Watches = a.objects.Status()
	}
	if a.tokens != nil {
		d.Tokens = a.tokens.Status()
	}
	if a.certs != nil {
		d.PodCertificates = a.certs.Status()
	}
	return d
}

// hostAllocatable is standalone mode's node allocatable, for unset limits
// of resourceFieldRef items: the machine's CPUs and memory and the size of
// the filesystem of the root directory (there is no Node object).
func hostAllocatable(rootDir string) func() v1.ResourceList {
	return func() v1.ResourceList {
		out := v1.ResourceList{v1.ResourceCPU: *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI)}
		if mem, err := memTotal(); err == nil {
			out[v1.ResourceMemory] = *resource.NewQuantity(mem, resource.BinarySI)
		}
		var st unix.Statfs_t
		if err := unix.Statfs(rootDir, &st); err == nil {
			out[v1.ResourceEphemeralStorage] = *resource.NewQuantity(int64(st.Blocks)*st.Bsize, resource.BinarySI)
		}
		return out
	}
}

func memTotal() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no MemTotal in /proc/meminfo")
}
