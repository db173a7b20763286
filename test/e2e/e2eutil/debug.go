package e2eutil

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The debug endpoint's documents as the tests read them
// (docs/debug-endpoint.md). They are the suites' own copy of the JSON
// field names, not the agent's Go types, so that decoding them checks the
// wire format.

// PodRef names a pod.
type PodRef struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// DSW is GET /debug/dsw, the desired state.
type DSW struct {
	SourcesReady bool        `json:"sourcesReady"`
	Volumes      []DSWVolume `json:"volumes"`
	Pods         []DSWPod    `json:"pods"`
}

// DSWVolume is a desired volume.
type DSWVolume struct {
	Name        string   `json:"name"`
	Plugin      string   `json:"plugin"`
	SpecName    string   `json:"specName"`
	Mode        string   `json:"mode"`
	PV          string   `json:"persistentVolume"`
	DesiredSize string   `json:"desiredSize"`
	Pods        []PodRef `json:"pods"`
}

// DSWPod is a desired pod.
type DSWPod struct {
	PodRef
	Volumes           []string   `json:"volumes"`
	VolumesReady      bool       `json:"volumesReady"`
	Errors            []PodError `json:"errors"`
	UnresolvedVolumes []string   `json:"unresolvedVolumes"`
}

// PodError is a problem with a pod's volume.
type PodError struct {
	Volume  string `json:"volume"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Pod returns the desired pod namespace/name, nil if there is none.
func (d *DSW) Pod(namespace, name string) *DSWPod {
	return find(d.Pods, func(p *DSWPod) bool { return p.Namespace == namespace && p.Name == name })
}

// PodByUID returns the desired pod with the UID, nil if there is none.
func (d *DSW) PodByUID(uid string) *DSWPod {
	return find(d.Pods, func(p *DSWPod) bool { return p.UID == uid })
}

// Volume returns the desired volume of the unique name, nil if there is
// none.
func (d *DSW) Volume(name string) *DSWVolume {
	return find(d.Volumes, func(v *DSWVolume) bool { return v.Name == name })
}

// ASW is GET /debug/asw, the actual state.
type ASW struct {
	Volumes []ASWVolume `json:"volumes"`
}

// ASWVolume is an attached or mounted volume.
type ASWVolume struct {
	Name             string   `json:"name"`
	Plugin           string   `json:"plugin"`
	Mode             string   `json:"mode"`
	AttachState      string   `json:"attachState"`
	DeviceMountState string   `json:"deviceMountState"`
	DeviceMountPath  string   `json:"deviceMountPath"`
	Size             string   `json:"size"`
	ResizeBlocked    string   `json:"resizeBlocked"`
	Pods             []ASWPod `json:"pods"`
}

// ASWPod is a pod's mount of a volume.
type ASWPod struct {
	PodRef
	SpecName      string `json:"specName"`
	MountState    string `json:"mountState"`
	MountPath     string `json:"mountPath"`
	Reconstructed bool   `json:"reconstructed"`
}

// Volume returns the volume of the unique name, nil if there is none.
func (d *ASW) Volume(name string) *ASWVolume {
	return find(d.Volumes, func(v *ASWVolume) bool { return v.Name == name })
}

// Operations is GET /debug/operations: the operations running or waiting
// to be retried.
type Operations struct {
	Operations []Operation `json:"operations"`
}

// Operation is a running or failed operation.
type Operation struct {
	Volume    string     `json:"volume"`
	Pod       *PodRef    `json:"pod"`
	Operation string     `json:"operation"`
	Plugin    string     `json:"plugin"`
	State     string     `json:"state"`
	Since     time.Time  `json:"since"`
	LastError string     `json:"lastError"`
	RetryAt   *time.Time `json:"retryAt"`
}

// Find returns the operation of the kind (mount_device...) on the volume,
// if there is one.
func (d *Operations) Find(volume, operation string) (Operation, bool) {
	if op := find(d.Operations, func(op *Operation) bool { return op.Volume == volume && op.Operation == operation }); op != nil {
		return *op, true
	}
	return Operation{}, false
}

// find returns the first element of s that match accepts, nil if none does.
func find[T any](s []T, match func(*T) bool) *T {
	for i := range s {
		if match(&s[i]) {
			return &s[i]
		}
	}
	return nil
}

// Sources is GET /debug/sources.
type Sources struct {
	Synced      bool `json:"synced"`
	InputErrors []struct {
		Input string `json:"input"`
		Error string `json:"error"`
	} `json:"inputErrors"`
	// Watches are the claims, volumes and attachments watched one by one.
	Watches []struct {
		Resource string `json:"resource"`
		Key      struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		} `json:"key"`
		Owners int  `json:"owners"`
		Synced bool `json:"synced"`
	} `json:"watches"`
}

// Events is GET /debug/events, the agent's recent events.
type Events struct {
	Events []struct {
		Object struct {
			Kind      string `json:"kind"`
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
			UID       string `json:"uid"`
		} `json:"object"`
		Type    string `json:"type"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
	} `json:"events"`
}

// Orphans is GET /debug/orphans: what the agent found on disk and could
// not clean up.
type Orphans struct {
	Orphans []struct {
		Path   string `json:"path"`
		PodUID string `json:"podUID"`
		Reason string `json:"reason"`
	} `json:"orphans"`
}

// Drivers is GET /debug/drivers, the CSI drivers the agent knows.
type Drivers struct {
	Drivers []Driver `json:"drivers"`
	// NodeInfo says whether the cluster knows each driver is on the node
	// (cluster mode).
	NodeInfo []struct {
		Driver    string `json:"driver"`
		State     string `json:"state"`
		NodeID    string `json:"nodeID"`
		LastError string `json:"lastError"`
	} `json:"nodeInfo"`
}

// NodeInfoState is the node-info state of a driver ("installed",
// "pending", "failed"), "" when the agent reports none.
func (d *Drivers) NodeInfoState(name string) string {
	for _, n := range d.NodeInfo {
		if n.Driver == name {
			return n.State
		}
	}
	return ""
}

// Driver is a registered CSI driver on /debug/drivers: what the driver's
// NodeGetInfo and capabilities said.
type Driver struct {
	Name               string            `json:"name"`
	Endpoint           string            `json:"endpoint"`
	Source             string            `json:"source"`
	RegistrationSocket string            `json:"registrationSocket"`
	NodeID             string            `json:"nodeID"`
	MaxVolumesPerNode  int64             `json:"maxVolumesPerNode"`
	Topology           map[string]string `json:"topology"`
	NodeCapabilities   []string          `json:"nodeCapabilities"`
	StageUnstage       bool              `json:"stageUnstage"`
	ControllerPublish  bool              `json:"controllerPublish"`
	// SingleNodeMultiWriter: the node service has the capability.
	SingleNodeMultiWriter bool `json:"singleNodeMultiWriter"`
	// Policy is what the driver's CSIDriver object makes the agent do.
	Policy struct {
		CSIDriverObject   bool     `json:"csiDriverObject"`
		AttachRequired    bool     `json:"attachRequired"`
		RequiresRepublish bool     `json:"requiresRepublish"`
		TokenAudiences    []string `json:"tokenAudiences"`
	} `json:"policy"`
}

// Driver returns the driver of that name, nil if it is not registered.
func (d *Drivers) Driver(name string) *Driver {
	return find(d.Drivers, func(drv *Driver) bool { return drv.Name == name })
}

// APIVolumes is GET /debug/api-volumes: what API volumes were built from,
// what is watched, and the tokens' lifetimes (never content).
type APIVolumes struct {
	Credentials string `json:"credentials"`
	Volumes     []struct {
		Volume string `json:"volume"`
		Plugin string `json:"plugin"`
		Pod    PodRef `json:"pod"`
		Inputs []struct {
			Kind            string    `json:"kind"`
			Name            string    `json:"name"`
			ResourceVersion string    `json:"resourceVersion"`
			Missing         bool      `json:"missing"`
			RefreshAt       time.Time `json:"refreshAt"`
		} `json:"inputs"`
		LastWritten time.Time `json:"lastWritten"`
		Writes      int       `json:"writes"`
	} `json:"volumes"`
	Watches []struct {
		Resource string `json:"resource"`
		Key      struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		} `json:"key"`
		Owners    int  `json:"owners"`
		Immutable bool `json:"immutable"`
	} `json:"watches"`
	Tokens []struct {
		Namespace      string    `json:"namespace"`
		ServiceAccount string    `json:"serviceAccount"`
		Audience       string    `json:"audience"`
		PodUID         string    `json:"podUID"`
		Expires        time.Time `json:"expires"`
		RefreshAt      time.Time `json:"refreshAt"`
	} `json:"tokens"`
}

// APIVolumes reads /debug/api-volumes.
func (a *Agent) APIVolumes() (*APIVolumes, error) { return getDoc[APIVolumes](a, "/debug/api-volumes") }

// DSW reads /debug/dsw.
func (a *Agent) DSW() (*DSW, error) { return getDoc[DSW](a, "/debug/dsw") }

// ASW reads /debug/asw.
func (a *Agent) ASW() (*ASW, error) { return getDoc[ASW](a, "/debug/asw") }

// Operations reads /debug/operations.
func (a *Agent) Operations() (*Operations, error) { return getDoc[Operations](a, "/debug/operations") }

// Sources reads /debug/sources.
func (a *Agent) Sources() (*Sources, error) { return getDoc[Sources](a, "/debug/sources") }

// Events reads /debug/events.
func (a *Agent) Events() (*Events, error) { return getDoc[Events](a, "/debug/events") }

// Orphans reads /debug/orphans.
func (a *Agent) Orphans() (*Orphans, error) { return getDoc[Orphans](a, "/debug/orphans") }

// Drivers reads /debug/drivers.
func (a *Agent) Drivers() (*Drivers, error) { return getDoc[Drivers](a, "/debug/drivers") }

func getDoc[T any](a *Agent, path string) (*T, error) {
	var doc T
	return &doc, a.getJSON(path, &doc)
}

// GetRaw returns a document of the debug endpoint as text.
func (a *Agent) GetRaw(path string) (string, error) {
	resp, err := a.client.Get(a.debugURL + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// getJSON decodes a JSON document of the debug endpoint.
func (a *Agent) getJSON(path string, into any) error {
	resp, err := a.client.Get(a.debugURL + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, body)
	}
	if err := json.Unmarshal(body, into); err != nil {
		return fmt.Errorf("GET %s: %v", path, err)
	}
	return nil
}

// Metrics returns every sample of /metrics, by the series as written
// ("name{label=\"value\",...}").
func (a *Agent) Metrics() (map[string]float64, error) {
	resp, err := a.client.Get(a.metricsURL + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// Metric returns the value of an unlabelled metric.
func (a *Agent) Metric(name string) (float64, error) {
	ms, err := a.Metrics()
	if err != nil {
		return 0, err
	}
	v, ok := ms[name]
	if !ok {
		return 0, fmt.Errorf("metric %s not found", name)
	}
	return v, nil
}
