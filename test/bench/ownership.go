package main

// -scenario ownership: how long giving a pod's fsGroup to a volume's tree
// takes, three ways on the same trees: the kubelet's own code
// (volume.NewVolumeOwnership(...).ChangePermissions() from the k8s.io/kubernetes
// module, run by ownership-peer from test/tools), the agent's reference walk
// (safefs.SetGroupSequential) and the agent's walk (safefs.SetGroup,
// parallel). Each is timed from the same wrong state (every entry with
// another group and too few mode bits, so all of them change) with a warm
// and a cold cache, then once more on the tree it just fixed (already
// right). The trees: wide (directories of 100 files, 2 symbolic links
// each) and deep (100 chains of nested directories, 10 files a level), on
// the root disk and on an ext4 on a loop device. Beside them, on the wide
// trees with a warm cache, the kernel floor (ownershipfloor: the same
// system calls per entry on a tree listed beforehand, one thread per CPU):
// kubelet ÷ floor is the most any walker can gain over the kubelet there;
// "floor+readdir" also reads each directory, as a walker must.

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/safefs"
	"github.com/volume-agent/volume-agent/test/bench/ownershipfloor"
)

const (
	ownGID   = 4242 // the fsGroup
	wrongGID = 1000 // the group every run starts from
)

type ownershipImpl struct {
	name string
	run  func(dir string) (time.Duration, error)
	// floor: run on wide trees with a warm cache only (its listing would
	// warm a cold one, and it opens directories by path).
	floor bool
}

func runOwnership(o options) error {
	peer := o.ownershipPeer
	if peer == "" {
		if bin := os.Getenv("VOLUME_AGENT_TOOLS_BIN"); bin != "" {
			peer = filepath.Join(bin, "ownership-peer")
		}
	}
	if peer == "" {
		return fmt.Errorf("ownership: no kubelet peer: set -ownership-peer or VOLUME_AGENT_TOOLS_BIN (test/tools/build.sh)")
	}
	g := safefs.Group{GID: ownGID, FileBits: 0o660, DirBits: 0o2770}
	impls := []ownershipImpl{
		{name: "kubelet", run: func(dir string) (time.Duration, error) {
			// stderr has the kubelet's own log (its warning after 30 s).
			var stderr strings.Builder
			cmd := exec.Command(peer, "-dir", dir, "-gid", strconv.Itoa(ownGID))
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				return 0, fmt.Errorf("%s: %v: %s", peer, err, stderr.String())
			}
			ns, err := strconv.ParseInt(strings.TrimPrefix(strings.TrimSpace(string(out)), "ownership-peer "), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s printed %q", peer, out)
			}
			return time.Duration(ns), nil
		}},
		{name: "agent-seq", run: func(dir string) (time.Duration, error) {
			start := time.Now()
			err := safefs.SetGroupSequential(context.Background(), dir, g)
			return time.Since(start), err
		}},
		{name: "agent", run: func(dir string) (time.Duration, error) {
			start := time.Now()
			err := safefs.SetGroup(context.Background(), dir, g)
			return time.Since(start), err
		}},
		floorImpl("floor", g, false),
		floorImpl("floor+readdir", g, true),
	}
	var sizes []int
	for _, s := range strings.Split(o.ownershipFiles, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1000 {
			return fmt.Errorf("-ownership-files: %q is not a number of files (at least 1000)", s)
		}
		sizes = append(sizes, n)
	}
	fmt.Printf("ownership: fsGroup %d on trees in group %d (files 0600, dirs 0700), %d round(s), median; GOMAXPROCS %d\n",
		ownGID, wrongGID, o.runs, runtime.GOMAXPROCS(0))
	for _, disk := range strings.Split(o.ownershipDisks, ",") {
		for _, n := range sizes {
			for _, shape := range strings.Split(o.ownershipShapes, ",") {
				if shape != "wide" && shape != "deep" {
					return fmt.Errorf("-ownership-shapes: %q is neither wide nor deep", shape)
				}
				if err := ownershipCase(o, disk, shape, n, impls); err != nil {
					return fmt.Errorf("%s %s %d: %w", disk, shape, n, err)
				}
			}
		}
	}
	return nil
}

// ownershipCase builds one tree and times every implementation on it.
func ownershipCase(o options, disk, shape string, n int, impls []ownershipImpl) error {
	work, err := os.MkdirTemp("/var/tmp", "volume-agent-bench-ownership-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	dir := filepath.Join(work, "vol")
	switch disk {
	case "root":
	case "loop":
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
		cleanup, err := loopExt4(filepath.Join(work, "vol.img"), dir, n)
		if err != nil {
			return err
		}
		defer cleanup()
	default:
		return fmt.Errorf("-ownership-disks: %q is neither root nor loop", disk)
	}
	start := time.Now()
	entries, err := makeTree(dir, shape, n)
	if err != nil {
		return err
	}
	fmt.Printf("  %s, %s: %d files, %d entries in all (made in %v)\n", disk, shapeName(shape, n), n, entries, time.Since(start).Round(time.Millisecond))
	type key struct{ impl, phase string }
	times := map[key][]time.Duration{}
	phases := []string{"warm", "cold", "already right"}
	for range o.runs {
		for _, cold := range []bool{false, true} {
			for _, impl := range impls {
				if impl.floor && (cold || shape != "wide") {
					continue
				}
				if err := resetTree(dir); err != nil {
					return err
				}
				unix.Sync()
				phase := "warm"
				if cold {
					phase = "cold"
					if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
						return fmt.Errorf("dropping caches: %w", err)
					}
				}
				d, err := impl.run(dir)
				if err != nil {
					return err
				}
				if err := checkTree(dir); err != nil {
					return fmt.Errorf("%s: %w", impl.name, err)
				}
				times[key{impl.name, phase}] = append(times[key{impl.name, phase}], d)
				if !cold {
					unix.Sync()
					d, err := impl.run(dir)
					if err != nil {
						return err
					}
					times[key{impl.name, "already right"}] = append(times[key{impl.name, "already right"}], d)
				}
			}
		}
	}
	for _, phase := range phases {
		line := fmt.Sprintf("    %-14s", phase)
		med := map[string]time.Duration{}
		for _, impl := range impls {
			ts := times[key{impl.name, phase}]
			if len(ts) == 0 {
				line += fmt.Sprintf("  %s %8s", impl.name, "-")
				continue
			}
			med[impl.name] = median(ts)
			line += fmt.Sprintf("  %s %8v", impl.name, med[impl.name].Round(time.Millisecond))
		}
		line += fmt.Sprintf("  kubelet/agent %.1fx  kubelet/agent-seq %.1fx",
			float64(med["kubelet"])/float64(med["agent"]), float64(med["kubelet"])/float64(med["agent-seq"]))
		if f, fr := med["floor"], med["floor+readdir"]; f > 0 && fr > 0 {
			line += fmt.Sprintf("  kubelet/floor %.1fx (+readdir %.1fx)  agent/floor %.2fx (+readdir %.2fx)",
				float64(med["kubelet"])/float64(f), float64(med["kubelet"])/float64(fr),
				float64(med["agent"])/float64(f), float64(med["agent"])/float64(fr))
		}
		fmt.Println(line)
	}
	return nil
}

// floorImpl is the kernel floor on a tree listed first (untimed).
func floorImpl(name string, g safefs.Group, readDirs bool) ownershipImpl {
	return ownershipImpl{name: name, floor: true, run: func(dir string) (time.Duration, error) {
		tree, err := ownershipfloor.List(dir)
		if err != nil {
			return 0, err
		}
		start := time.Now()
		err = tree.Run(g.GID, g.FileBits, g.DirBits, 0, readDirs)
		return time.Since(start), err
	}}
}

func shapeName(shape string, n int) string {
	if shape == "wide" {
		return fmt.Sprintf("wide (%d dirs x 100 files + %d symlinks)", n/100, n/50)
	}
	return fmt.Sprintf("deep (100 chains x %d levels x 10 files)", n/1000)
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// loopExt4 mounts a fresh ext4 on a loop device at dir, with inodes for n
// files and more.
func loopExt4(img, dir string, n int) (func(), error) {
	size := max(2<<30, int64(n)*2048)
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		return nil, err
	}
	if err := os.Truncate(img, size); err != nil {
		return nil, err
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-N", strconv.Itoa(n+n/2+10000), img).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mkfs.ext4: %v: %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, dir).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mount: %v: %s", err, out)
	}
	// umount of a loop mount set up with -o loop detaches the device.
	return func() { _ = exec.Command("umount", dir).Run() }, nil
}

// makeTree fills dir (made if missing) with n files in the shape asked,
// relative to directory descriptors, a few directories at once; it
// returns the number of entries.
func makeTree(dir, shape string, n int) (int, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	units, perUnit := n/100, 1 // wide: a directory of 100 files
	if shape == "deep" {
		units, perUnit = 100, n/1000 // deep: a chain of n/1000 levels
	}
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	next := make(chan int)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for u := range next {
				if err := makeUnit(dir, shape, u, perUnit); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
				}
			}
		}()
	}
	for u := range units {
		next <- u
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	if shape == "wide" {
		return 1 + units*(1+100+2), nil
	}
	return 1 + units*perUnit*(1+10), nil
}

func makeUnit(dir, shape string, u, levels int) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	name := fmt.Sprintf("d%05d", u)
	files, links := 100, 2
	if shape == "deep" {
		files, links = 10, 0
	}
	for range levels {
		if err := unix.Mkdirat(fd, name, 0o700); err != nil {
			unix.Close(fd)
			return err
		}
		sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return err
		}
		fd = sub
		for f := range files {
			ffd, err := unix.Openat(fd, fmt.Sprintf("file-%03d", f), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
			if err != nil {
				unix.Close(fd)
				return err
			}
			unix.Close(ffd)
		}
		for l := range links {
			if err := unix.Symlinkat(fmt.Sprintf("file-%03d", l), fd, fmt.Sprintf("link-%d", l)); err != nil {
				unix.Close(fd)
				return err
			}
		}
		name = "d"
	}
	return unix.Close(fd)
}

// resetTree puts every entry below dir (dir included) in the wrong state:
// group wrongGID, files 0600, directories 0700.
func resetTree(dir string) error {
	return forEachEntry(dir, func(p string, d fs.DirEntry) error {
		if err := os.Lchown(p, -1, wrongGID); err != nil {
			return err
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			return nil
		case d.IsDir():
			return os.Chmod(p, 0o700)
		default:
			return os.Chmod(p, 0o600)
		}
	})
}

// checkTree fails unless every entry below dir has the fsGroup and bits.
func checkTree(dir string) error {
	return forEachEntry(dir, func(p string, d fs.DirEntry) error {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		want := uint32(0o660)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			want = 0
		case d.IsDir():
			want = 0o2770
		}
		if st.Gid != ownGID || st.Mode&want != want {
			return fmt.Errorf("%s: group %d, mode %o after the walk", p, st.Gid, st.Mode)
		}
		return nil
	})
}

// forEachEntry calls fn on dir and every entry below it, by path (the
// bench's own trees), a few top-level subtrees at once.
func forEachEntry(dir string, fn func(string, fs.DirEntry) error) error {
	top, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if err := fn(dir, fs.FileInfoToDirEntry(fi)); err != nil {
		return err
	}
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	next := make(chan string)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range next {
				err := filepath.WalkDir(p, func(p string, d fs.DirEntry, err error) error {
					if err != nil {
						return err
					}
					return fn(p, d)
				})
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
				}
			}
		}()
	}
	for _, e := range top {
		next <- filepath.Join(dir, e.Name())
	}
	close(next)
	wg.Wait()
	return firstErr
}
