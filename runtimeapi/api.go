// Package runtimeapi is the contract between volume-agent and whatever
// starts the containers of the pods on its node (a CRI shim, a
// virtual-kubelet provider, an edge runtime): the versioned JSON documents
// of the local runtime API, served on a unix socket under the agent's root
// directory (runtimeapi/server) and read with runtimeapi/client. It gives a
// runtime what the kubelet's runtime side gets from its volume manager: wait
// until a pod's volumes are ready (or learn which are not, and why), then
// the host path or device of each volume and, for each container, the
// mounts and devices to give it, sub-paths prepared. docs/runtime-api.md
// describes it for people.
package runtimeapi

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Version is the API version: the first element of every path and the
// apiVersion of every document. A later version is served beside it.
const Version = "v1"

// SocketName is the socket's name in the agent's root directory.
const SocketName = "runtime.sock"

// Socket is the socket of an agent whose --root-dir is root.
func Socket(root string) string { return filepath.Join(root, SocketName) }

// PodList is GET /v1/pods: the pods on this node the agent manages.
type PodList struct {
	APIVersion string       `json:"apiVersion"`
	Pods       []PodSummary `json:"pods"`
}

// PodSummary names a pod and says whether its volumes are ready.
type PodSummary struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Ready     bool   `json:"ready"`
}

// Pod is GET /v1/pods/{uid} and /v1/pods/{uid}/wait: a pod's volumes and
// what each of its containers gets from them.
type Pod struct {
	APIVersion string `json:"apiVersion"`
	UID        string `json:"uid"`
	Namespace  string `json:"namespace"`
	Name       string `json:"name"`
	// Ready is true when every volume the pod's containers use is ready:
	// then every HostPath and DevicePath in the document is in place.
	Ready bool `json:"ready"`
	// Message says which volumes are not ready and why, in one line
	// (empty when Ready).
	Message string `json:"message,omitempty"`
	// Warnings are what is wrong with the pod without making it unready:
	// local storage over its limits (the condition's LocalStorageOverLimit).
	Warnings   []Warning   `json:"warnings,omitempty"`
	Volumes    []Volume    `json:"volumes"`
	Containers []Container `json:"containers"`
}

// Warning is one of a pod's warnings.
type Warning struct {
	// Volume is the pod's name for the volume; empty for the pod as a
	// whole.
	Volume string `json:"volume,omitempty"`
	// Reason is EmptyDirOverLimit or EphemeralStorageOverLimit (the
	// events' reasons); clients ignore ones they do not know.
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Volume modes.
const (
	Filesystem = "Filesystem"
	Block      = "Block"
)

// Reasons a volume is not ready.
const (
	// ReasonWaitingForAttach: the volume is not attached to the node yet.
	ReasonWaitingForAttach = "WaitingForAttach"
	// ReasonWaitingForDevice: the volume's device is not mounted (staged)
	// yet.
	ReasonWaitingForDevice = "WaitingForDeviceMount"
	// ReasonWaitingForMount: the volume is not set up for the pod yet.
	ReasonWaitingForMount = "WaitingForMount"
	// ReasonWaitingForSubPaths: the volume is set up, the sub-paths the
	// containers mount are not prepared yet.
	ReasonWaitingForSubPaths = "WaitingForSubPaths"
	// ReasonMountFailed: the last attempt to attach, stage or set up the
	// volume failed (Message says how); it is retried.
	ReasonMountFailed = "MountFailed"
	// ReasonSubPathFailed: preparing a sub-path failed (Message says
	// which and how); it is retried.
	ReasonSubPathFailed = "SubPathFailed"
	// Any other reason classifies a problem found resolving the volume,
	// named as in the agent's events and metrics: NotReadYet (its claim is
	// being read: a wait) and LookupFailed (retried) go away on their own;
	// the others (PVCNotFound, InvalidSubPath, UnsupportedVolume...) need a
	// change to the pod or to what it refers to, and say so in
	// NeedsChange.
)

// Volume is one volume of the pod, by the name the pod gives it.
type Volume struct {
	Name  string `json:"name"`
	Ready bool   `json:"ready"`
	// Reason and Message say why the volume is not ready.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// NeedsChange: the volume will not become ready until the pod or what
	// it refers to changes (a runtime may fail the pod's start at once);
	// false while it waits or its operation is retried.
	NeedsChange bool `json:"needsChange,omitempty"`
	// Plugin is the volume plugin (kubernetes.io/empty-dir...).
	Plugin string `json:"plugin,omitempty"`
	// VolumeMode is Filesystem (HostPath is set when ready) or Block
	// (DevicePath is set when ready).
	VolumeMode string `json:"volumeMode"`
	HostPath   string `json:"hostPath,omitempty"`
	DevicePath string `json:"devicePath,omitempty"`
	ReadOnly   bool   `json:"readOnly,omitempty"`
	// SELinuxRelabel is the hint a runtime passes on as the CRI mount's
	// selinux_relabel: the content is the pod's own and may be relabelled
	// for the container (false for host paths, devices and images).
	SELinuxRelabel bool `json:"selinuxRelabel,omitempty"`
	// Image is set for an image volume (volumes[].image): the runtime
	// mounts the image itself, read-only; there is no HostPath.
	Image *ImageVolume `json:"image,omitempty"`
}

// ImageVolume is what a runtime needs to mount an image volume, the CRI
// Mount's image: pull Reference as PullPolicy says, then mount the image's
// merged layers read-only. docs/runtime-api.md says what the runtime must
// do.
type ImageVolume struct {
	// Reference is the image or artifact reference as the pod gives it.
	Reference string `json:"reference"`
	// PullPolicy is Always, IfNotPresent or Never; when the pod gives
	// none, the API server's default (Always for a :latest tag or for no
	// tag and no digest, IfNotPresent otherwise).
	PullPolicy string `json:"pullPolicy"`
}

// Container is what one container gets.
type Container struct {
	Name string `json:"name"`
	// Type is init, regular or ephemeral.
	Type    string   `json:"type"`
	Mounts  []Mount  `json:"mounts,omitempty"`
	Devices []Device `json:"devices,omitempty"`
}

// Mount is one volumeMounts entry of a container: bind HostPath at
// ContainerPath, or for an image volume mount Image (at ImageSubPath in
// it). HostPath is empty while the volume is not ready, and always for an
// image volume.
type Mount struct {
	Volume        string `json:"volume"`
	ContainerPath string `json:"containerPath"`
	// HostPath is the volume's HostPath, or for a sub-path the bind mount
	// the agent prepared of it (never a path inside the volume: bind it
	// as it is, do not resolve it further).
	HostPath string `json:"hostPath,omitempty"`
	ReadOnly bool   `json:"readOnly,omitempty"`
	// SubPath is the sub-path (subPathExpr expanded) HostPath binds, for
	// people; runtimes use HostPath.
	SubPath string `json:"subPath,omitempty"`
	// Propagation is None, HostToContainer or Bidirectional.
	Propagation string `json:"propagation"`
	// RecursiveReadOnly is the volumeMount's recursiveReadOnly, if set.
	RecursiveReadOnly string `json:"recursiveReadOnly,omitempty"`
	SELinuxRelabel    bool   `json:"selinuxRelabel,omitempty"`
	// Image is the volume's Image, for a mount of an image volume (the
	// CRI Mount's image); ReadOnly is then always true.
	Image *ImageVolume `json:"image,omitempty"`
	// ImageSubPath is the sub-path (subPathExpr expanded) inside the
	// image to mount instead of its root (the CRI Mount's
	// image_sub_path), set when the volume is ready. The runtime
	// resolves it within the image and fails the container if it does
	// not exist or leaves the image.
	ImageSubPath string `json:"imageSubPath,omitempty"`
}

// Device is one volumeDevices entry: make the block device HostPath (a
// device node, or a link to one) available at ContainerPath.
type Device struct {
	Volume        string `json:"volume"`
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath,omitempty"`
	ReadOnly      bool   `json:"readOnly,omitempty"`
	// Permissions are the cgroup device permissions to grant: "mrw", or
	// "r" when read-only.
	Permissions string `json:"permissions"`
}

// ErrorDocument is the body of every error response.
type ErrorDocument struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody says what went wrong.
type ErrorBody struct {
	// Code is one of the Code* constants.
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error codes.
const (
	CodeBadRequest   = "BadRequest"   // 400
	CodeForbidden    = "Forbidden"    // 403: the client is not root
	CodePodNotFound  = "PodNotFound"  // 404: no such pod on this node
	CodeNotFound     = "NotFound"     // 404: no such path
	CodeShuttingDown = "ShuttingDown" // 503: the agent is stopping
)

// maxSocketPath is the longest path a unix socket address holds.
const maxSocketPath = len(unix.RawSockaddrUnix{}.Path) - 1

// Dial connects to the socket at path. A path too long for a socket
// address is reached through a descriptor of its directory.
func Dial(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	if len(path) <= maxSocketPath {
		return d.DialContext(ctx, "unix", path)
	}
	var conn net.Conn
	err := viaDirFd(path, func(short string) error {
		var err error
		conn, err = d.DialContext(ctx, "unix", short)
		return err
	})
	return conn, err
}

// viaDirFd calls f with a short name of path, /proc/self/fd/N/<base>, valid
// while f runs.
func viaDirFd(path string, f func(short string) error) error {
	dir, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening the directory of %s: %w", path, err)
	}
	defer unix.Close(dir)
	short := "/proc/self/fd/" + strconv.Itoa(dir) + "/" + filepath.Base(path)
	if len(short) > maxSocketPath {
		return fmt.Errorf("socket name %q is too long", filepath.Base(path))
	}
	return f(short)
}

// ListenShort listens on a unix socket at path, through a descriptor of its
// directory when path is too long for a socket address.
func ListenShort(path string) (*net.UnixListener, error) {
	if len(path) <= maxSocketPath {
		return net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	}
	var l *net.UnixListener
	err := viaDirFd(path, func(short string) error {
		var err error
		l, err = net.ListenUnix("unix", &net.UnixAddr{Name: short, Net: "unix"})
		return err
	})
	return l, err
}
