// Command runtime-consumer is an example container runtime built on
// volume-agent's runtime API: for every pod in a directory of manifests it
// waits for the pod's volumes through the API, then runs each container's
// command (no images: the command runs from the host's /usr) as a process
// in a mount namespace of its own, with every volume mounted where the
// container's volumeMounts and volumeDevices say — read-only where asked,
// sub-paths as the agent prepared them. It prints what the containers print.
//
//	runtime-consumer -socket /var/lib/volume-agent/runtime.sock -manifests DIR
//	runtime-consumer -socket ... -list
//
// Init containers run first, one after the other, then the regular
// containers of the pod together. Containers without a command are
// skipped: there is no image to take one from. It needs root, like the API.
//
// Image volumes come from a local OCI image layout instead of a registry
// (package oci): -image-layout names it, the reference is matched with
// the org.opencontainers.image.ref.name annotation (or by digest), the
// image is unpacked once into -image-cache as the pull policy says, and
// mounted read-only (nosuid, nodev), its sub-path resolved inside it.
//
//	runtime-consumer build-image -from DIR -layout LAYOUT -ref NAME:TAG
//
// builds (or adds to) such a layout: one layer with DIR's files.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/volume-agent/volume-agent/examples/runtime-consumer/oci"
	"github.com/volume-agent/volume-agent/runtimeapi"
	"github.com/volume-agent/volume-agent/runtimeapi/client"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == childArg {
		// The container side: see child.go.
		if err := runChild(); err != nil {
			fmt.Fprintln(os.Stderr, "runtime-consumer:", err)
			os.Exit(126)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "build-image" {
		if err := buildImage(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "runtime-consumer build-image:", err)
			os.Exit(1)
		}
		return
	}
	socket := flag.String("socket", runtimeapi.Socket("/var/lib/volume-agent"), "the agent's runtime API socket")
	manifests := flag.String("manifests", "", "directory of pod manifests (YAML or JSON) whose containers to run")
	timeout := flag.Duration("timeout", 30*time.Second, "how long to wait for a pod's volumes")
	runFor := flag.Duration("container-timeout", time.Minute, "how long a container may run before it is killed")
	workDir := flag.String("work-dir", "", "where containers' root directories are made (default: a new directory under $TMPDIR)")
	list := flag.Bool("list", false, "only list the pods the agent manages")
	layout := flag.String("image-layout", "", "the OCI image layout image volumes are taken from (no registry)")
	imageCache := flag.String("image-cache", "", "where images are unpacked, each once (default: image-cache next to -image-layout)")
	flag.Parse()
	if *imageCache == "" && *layout != "" {
		*imageCache = filepath.Join(filepath.Dir(filepath.Clean(*layout)), "image-cache")
	}

	c := client.New(*socket)
	ctx, stop := signalContext()
	defer stop()
	if *list {
		if err := listPods(ctx, c); err != nil {
			fmt.Fprintln(os.Stderr, "runtime-consumer:", err)
			os.Exit(1)
		}
		return
	}
	if *manifests == "" {
		fmt.Fprintln(os.Stderr, "runtime-consumer: -manifests is required (or -list)")
		os.Exit(2)
	}
	r := &runner{client: c, timeout: *timeout, runFor: *runFor, workDir: *workDir, out: newPrinter(os.Stdout)}
	if *layout != "" {
		r.images = &oci.Cache{Dir: *imageCache, Layout: *layout}
	}
	if err := r.run(ctx, *manifests); err != nil {
		fmt.Fprintln(os.Stderr, "runtime-consumer:", err)
		os.Exit(1)
	}
}

func listPods(ctx context.Context, c *client.Client) error {
	l, err := c.Pods(ctx)
	if err != nil {
		return err
	}
	for _, p := range l.Pods {
		fmt.Printf("%s/%s uid=%s ready=%v\n", p.Namespace, p.Name, p.UID, p.Ready)
	}
	return nil
}

// runner runs the pods of a manifest directory.
type runner struct {
	client  *client.Client
	timeout time.Duration
	runFor  time.Duration
	workDir string
	out     *printer
	// images holds image volumes' images (nil: no -image-layout).
	images *oci.Cache
}

func (r *runner) run(ctx context.Context, dir string) error {
	pods, err := readPods(dir)
	if err != nil {
		return err
	}
	if r.workDir == "" {
		if r.workDir, err = os.MkdirTemp("", "runtime-consumer-"); err != nil {
			return err
		}
		defer os.RemoveAll(r.workDir)
	}
	var wg sync.WaitGroup
	failed := make(chan string, len(pods))
	for _, pod := range pods {
		wg.Go(func() {
			if err := r.runPod(ctx, pod); err != nil {
				r.out.line(pod.Namespace+"/"+pod.Name, err.Error())
				failed <- pod.Name
			}
		})
	}
	wg.Wait()
	close(failed)
	var names []string
	for n := range failed {
		names = append(names, n)
	}
	if len(names) > 0 {
		sort.Strings(names)
		return fmt.Errorf("pods that did not run: %s", strings.Join(names, ", "))
	}
	return nil
}

// readPods reads the running pods of the manifests: every document of kind
// Pod not in phase Succeeded or Failed.
func readPods(dir string) ([]*v1.Pod, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		return nil, err
	}
	var pods []*v1.Pod
	for _, f := range files {
		if ext := filepath.Ext(f); ext != ".yaml" && ext != ".yml" && ext != ".json" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for _, doc := range strings.Split(string(data), "\n---") {
			var meta struct{ Kind string }
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil || meta.Kind != "Pod" {
				continue
			}
			pod := &v1.Pod{}
			if err := yaml.Unmarshal([]byte(doc), pod); err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if pod.Namespace == "" {
				pod.Namespace = "default"
			}
			if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
				continue
			}
			pods = append(pods, pod)
		}
	}
	return pods, nil
}

// runPod waits for the pod's volumes and runs its containers.
func (r *runner) runPod(ctx context.Context, pod *v1.Pod) error {
	name := pod.Namespace + "/" + pod.Name
	uid, err := r.uidOf(ctx, pod)
	if err != nil {
		return err
	}
	p, err := r.client.Wait(ctx, uid, r.timeout)
	if err != nil {
		var nr *client.NotReadyError
		if errors.As(err, &nr) {
			return fmt.Errorf("not started: %s", nr.Pod.Message)
		}
		return err
	}
	byName := map[string]runtimeapi.Container{}
	for _, c := range p.Containers {
		byName[c.Name] = c
	}
	for _, c := range pod.Spec.InitContainers {
		if err := r.runContainer(ctx, pod, uid, c, byName[c.Name]); err != nil {
			return fmt.Errorf("init container %s: %w", c.Name, err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, len(pod.Spec.Containers))
	for i, c := range pod.Spec.Containers {
		wg.Go(func() { errs[i] = r.runContainer(ctx, pod, uid, c, byName[c.Name]) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("container %s: %w", pod.Spec.Containers[i].Name, err)
		}
	}
	r.out.line(name, "all containers exited 0")
	return nil
}

// uidOf finds the pod's UID: its metadata.uid, or the one the agent gave
// it (standalone mode derives one from the namespace and name).
func (r *runner) uidOf(ctx context.Context, pod *v1.Pod) (string, error) {
	if pod.UID != "" {
		return string(pod.UID), nil
	}
	deadline := time.Now().Add(r.timeout)
	for delay := 50 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		l, err := r.client.Pods(ctx)
		if err != nil {
			return "", err
		}
		for _, p := range l.Pods {
			if p.Namespace == pod.Namespace && p.Name == pod.Name {
				return p.UID, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the agent does not manage this pod (not on its node, or terminated)")
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(delay):
		}
	}
}

// runContainer runs one container's command in a mount namespace of its
// own (see child.go).
func (r *runner) runContainer(ctx context.Context, pod *v1.Pod, uid string, c v1.Container, api runtimeapi.Container) error {
	label := pod.Namespace + "/" + pod.Name + "/" + c.Name
	if len(c.Command) == 0 {
		r.out.line(label, "skipped: no command (there is no image to take one from)")
		return nil
	}
	spec := containerSpec{
		Root:       filepath.Join(r.workDir, uid+"-"+c.Name),
		Command:    append(append([]string{}, c.Command...), c.Args...),
		Env:        containerEnv(pod, c),
		WorkingDir: c.WorkingDir,
		Hostname:   pod.Name,
	}
	for _, m := range api.Mounts {
		if m.Image != nil {
			dir, err := r.imageMount(ctx, m)
			if err != nil {
				return err
			}
			spec.Mounts = append(spec.Mounts, bind{Source: dir, ImageSubPath: m.ImageSubPath, Target: m.ContainerPath, ReadOnly: true, Image: true})
			continue
		}
		if m.HostPath == "" {
			return fmt.Errorf("the API gave no host path for the mount at %s", m.ContainerPath)
		}
		spec.Mounts = append(spec.Mounts, bind{Source: m.HostPath, Target: m.ContainerPath, ReadOnly: m.ReadOnly})
	}
	for _, d := range api.Devices {
		if d.HostPath == "" {
			return fmt.Errorf("the API gave no device for %s", d.ContainerPath)
		}
		spec.Mounts = append(spec.Mounts, bind{Source: d.HostPath, Target: d.ContainerPath, ReadOnly: d.ReadOnly})
	}
	if err := os.MkdirAll(spec.Root, 0o700); err != nil {
		return err
	}
	defer os.Remove(spec.Root) // only a mount point in the child's namespace

	ctx, cancel := context.WithTimeout(ctx, r.runFor)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/proc/self/exe", childArg)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// A mount namespace of its own: Go makes every mount in it
		// private, so nothing mounted there is seen outside, and it all
		// goes when the container's last process exits.
		Unshareflags: syscall.CLONE_NEWNS,
		Setsid:       true,
	}
	specR, specW, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.ExtraFiles = []*os.File{specR}
	outR, outW := io.Pipe()
	cmd.Stdout, cmd.Stderr = outW, outW
	if err := cmd.Start(); err != nil {
		specR.Close()
		specW.Close()
		return err
	}
	specR.Close()
	go func() {
		_ = writeSpec(specW, &spec)
		specW.Close()
	}()
	printed := make(chan struct{})
	go func() {
		defer close(printed)
		s := bufio.NewScanner(outR)
		for s.Scan() {
			r.out.line(label, s.Text())
		}
	}()
	err = cmd.Wait()
	outW.Close()
	<-printed
	if err != nil {
		return fmt.Errorf("%w (%s)", err, strings.Join(spec.Command, " "))
	}
	return nil
}

// containerEnv is the container's environment as far as this example
// resolves it: literal values and the pod's name, namespace, UID and node.
func containerEnv(pod *v1.Pod, c v1.Container) []string {
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME=" + pod.Name}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		case e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				env = append(env, e.Name+"="+pod.Name)
			case "metadata.namespace":
				env = append(env, e.Name+"="+pod.Namespace)
			case "metadata.uid":
				env = append(env, e.Name+"="+string(pod.UID))
			case "spec.nodeName":
				env = append(env, e.Name+"="+pod.Spec.NodeName)
			}
		}
	}
	return env
}

// printer writes lines of several containers without mixing them.
type printer struct {
	mu sync.Mutex
	w  io.Writer
}

func newPrinter(w io.Writer) *printer { return &printer{w: w} }

func (p *printer) line(label, s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "[%s] %s\n", label, s)
}
