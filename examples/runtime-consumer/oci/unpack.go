package oci

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/internal/safefs"
)

// Limits bound what unpacking one image may write: its layers are tenant
// content.
type Limits struct {
	// Bytes is the most file content all layers together may hold.
	Bytes int64
	// Entries is the most tar entries all layers together may hold.
	Entries int
}

// DefaultLimits are the limits of a Cache that sets none.
var DefaultLimits = Limits{Bytes: 256 << 20, Entries: 100_000}

// Cache holds the images of a layout unpacked, each once:
//
//	<Dir>/<manifest digest, hex>/   the image's layers merged, read-only for containers
//	<Dir>/refs/<sha256(reference)>  the manifest digest the reference resolved to: the image is "present"
//
// It is safe for concurrent use.
type Cache struct {
	Dir    string
	Layout string
	Limits Limits

	mu sync.Mutex
}

// Get returns the directory of ref's unpacked image, resolving ref
// against the layout (the example's pull) as policy says: Always resolves
// it every time, IfNotPresent when it was never resolved, Never not at
// all (an image never resolved is an error then). An image already
// unpacked is not unpacked again.
func (c *Cache) Get(ctx context.Context, ref, policy string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	refFile := filepath.Join(c.Dir, "refs", hashName(ref))
	if policy != "Always" {
		if d, err := readBounded(refFile, 128); err == nil {
			dir := filepath.Join(c.Dir, strings.TrimSpace(string(d)))
			if _, err := os.Lstat(dir); err == nil && validHex(filepath.Base(dir)) {
				return dir, nil
			}
		}
		if policy == "Never" {
			return "", fmt.Errorf("image %q is not present and its pullPolicy is Never", ref)
		}
	}
	desc, err := Resolve(c.Layout, ref)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(c.Dir, desc.Digest.Encoded())
	if _, err := os.Lstat(dir); err != nil {
		if err := c.unpack(ctx, desc, dir); err != nil {
			return "", fmt.Errorf("unpacking image %q (%s): %w", ref, desc.Digest, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(refFile), 0o700); err != nil {
		return "", err
	}
	return dir, writeFileAtomic(refFile, []byte(desc.Digest.Encoded()))
}

// unpack unpacks into a private directory renamed into place, so that a
// half-unpacked image is never used.
func (c *Cache) unpack(ctx context.Context, desc ocispec.Descriptor, dir string) error {
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(c.Dir, ".unpack-")
	if err != nil {
		return err
	}
	defer func() { _ = safefs.RemoveAll(context.WithoutCancel(ctx), tmp) }()
	limits := c.Limits
	if limits == (Limits{}) {
		limits = DefaultLimits
	}
	if _, err := Unpack(ctx, c.Layout, desc, tmp, limits); err != nil {
		return err
	}
	// The image is mounted read-only for containers; its root is theirs
	// to read.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

func hashName(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func validHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil && len(s) == 64
}

// Stats say what an unpack did.
type Stats struct {
	Entries int
	Bytes   int64
	// Skipped counts device nodes and FIFOs, never made.
	Skipped int
}

// Unpack applies the layers of the image manifest desc of the layout, in
// order, into dest, an existing empty directory. The layers are tenant
// content, so: every blob's size and digest are checked; an entry whose
// name has a ".." element is refused; nothing is ever resolved through a
// symbolic link (every parent is opened with O_NOFOLLOW from dest down,
// so a link an earlier entry made, absolute or not, cannot carry a later
// write out of dest); device nodes and FIFOs are skipped; set-user-ID,
// set-group-ID and sticky bits are dropped and everything is owned by the
// caller; file content, entries and the decompressed streams are bounded
// by limits. Whiteouts (.wh.<name>, .wh..wh..opq) remove what lower layers
// made, as for container images.
func Unpack(ctx context.Context, layout string, desc ocispec.Descriptor, dest string, limits Limits) (Stats, error) {
	var m ocispec.Manifest
	if err := readDocument(layout, desc, &m); err != nil {
		return Stats{}, err
	}
	if m.MediaType != "" && m.MediaType != ocispec.MediaTypeImageManifest {
		return Stats{}, fmt.Errorf("manifest %s has media type %q", desc.Digest, m.MediaType)
	}
	root, err := unix.Open(dest, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Stats{}, &os.PathError{Op: "open", Path: dest, Err: err}
	}
	defer unix.Close(root)
	u := &unpacker{ctx: ctx, root: root, limits: limits}
	// Tar headers and padding are not content: allow 4 KiB of them per
	// entry, no more.
	stream := &boundedReader{left: limits.Bytes + int64(limits.Entries)*4096}
	for _, l := range m.Layers {
		if err := u.layer(layout, l, stream); err != nil {
			return u.stats, fmt.Errorf("layer %s: %w", l.Digest, err)
		}
	}
	return u.stats, nil
}

type unpacker struct {
	ctx    context.Context
	root   int
	limits Limits
	stats  Stats
}

// boundedReader fails once more than left bytes were read through it.
type boundedReader struct {
	r    io.Reader
	left int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, errors.New("the layers' archives are larger than the limits allow")
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

func (u *unpacker) layer(layout string, desc ocispec.Descriptor, stream *boundedReader) error {
	blob, err := openBlob(layout, desc)
	if err != nil {
		return err
	}
	defer blob.Close()
	var r io.Reader = blob
	switch desc.MediaType {
	case ocispec.MediaTypeImageLayer, "application/vnd.docker.image.rootfs.diff.tar":
	case ocispec.MediaTypeImageLayerGzip, "application/vnd.docker.image.rootfs.diff.tar.gzip":
		zr, err := gzip.NewReader(blob)
		if err != nil {
			return err
		}
		defer zr.Close()
		r = zr
	default:
		return fmt.Errorf("layer media type %q is not supported by this example (tar or tar+gzip)", desc.MediaType)
	}
	stream.r = r
	tr := tar.NewReader(stream)
	for {
		if err := u.ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			// Read to the end, so the blob's digest is checked.
			_, err = io.Copy(io.Discard, blob)
			return err
		}
		if err != nil {
			return err
		}
		if err := u.entry(h, tr); err != nil {
			return fmt.Errorf("%q: %w", h.Name, err)
		}
	}
}

// clean turns an entry name into a path relative to the root, refusing
// any ".." element ("" is the root itself).
func clean(name string) (string, error) {
	if strings.ContainsRune(name, 0) {
		return "", errors.New("name contains NUL")
	}
	for _, el := range strings.Split(name, "/") {
		if el == ".." {
			return "", errors.New(`name has a ".." element`)
		}
	}
	return strings.TrimPrefix(path.Clean("/"+name), "/"), nil
}

func (u *unpacker) entry(h *tar.Header, r io.Reader) error {
	u.stats.Entries++
	if u.stats.Entries > u.limits.Entries {
		return fmt.Errorf("more than %d entries", u.limits.Entries)
	}
	rel, err := clean(h.Name)
	if err != nil {
		return err
	}
	switch h.Typeflag {
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		u.stats.Skipped++ // never a device node from tenant content
		return nil
	case tar.TypeXGlobalHeader:
		return nil
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink:
	default:
		return fmt.Errorf("entry type %q is not supported", h.Typeflag)
	}
	if rel == "" {
		return nil // the root: it stays as made
	}
	parent, base := path.Split(rel)
	dfd, err := u.openDir(parent, true)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if base == ".wh..wh..opq" {
		return u.emptyDir(dfd, parent)
	}
	if victim, ok := strings.CutPrefix(base, ".wh."); ok {
		if victim == "" || victim == "." || victim == ".." {
			return errors.New("whiteout names no entry of its directory")
		}
		return safefs.RemoveAllAt(u.ctx, dfd, victim, path.Join(parent, victim))
	}
	// Replace what lower layers (or earlier entries) put there, unless a
	// directory stays a directory.
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		if h.Typeflag != tar.TypeDir || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err := safefs.RemoveAllAt(u.ctx, dfd, base, rel); err != nil {
				return err
			}
		}
	}
	perm := uint32(h.Mode) & 0o777
	switch h.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(dfd, base, perm); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
		fd, err := unix.Openat(dfd, base, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Fchmod(fd, perm)
	case tar.TypeReg:
		if h.Size < 0 || h.Size > u.limits.Bytes-u.stats.Bytes {
			return fmt.Errorf("%d bytes: the image holds more than %d bytes", h.Size, u.limits.Bytes)
		}
		fd, err := unix.Openat(dfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), rel)
		defer f.Close()
		n, err := io.CopyN(f, r, h.Size)
		u.stats.Bytes += n
		if err != nil {
			return err
		}
		// The umask may have taken bits away.
		return f.Chmod(os.FileMode(perm))
	case tar.TypeSymlink:
		// Kept as written: it is resolved only inside the container's
		// root, never by the unpacker.
		if h.Linkname == "" || strings.ContainsRune(h.Linkname, 0) {
			return errors.New("symbolic link without a valid target")
		}
		return unix.Symlinkat(h.Linkname, dfd, base)
	case tar.TypeLink:
		target, err := clean(h.Linkname)
		if err != nil || target == "" {
			return fmt.Errorf("hard link to %q: not a file of the image", h.Linkname)
		}
		tparent, tbase := path.Split(target)
		tfd, err := u.openDir(tparent, false)
		if err != nil {
			return fmt.Errorf("hard link to %q: %w", h.Linkname, err)
		}
		defer unix.Close(tfd)
		if err := unix.Fstatat(tfd, tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			return fmt.Errorf("hard link to %q: not a regular file of the image", h.Linkname)
		}
		// No AT_SYMLINK_FOLLOW: the link is to the entry itself.
		return unix.Linkat(tfd, tbase, dfd, base, 0)
	}
	return nil
}

// openDir opens the directory rel below the root one element at a time,
// never following a symbolic link, making missing ones (0755) if create.
func (u *unpacker) openDir(rel string, create bool) (int, error) {
	fd, err := unix.Dup(u.root)
	if err != nil {
		return -1, err
	}
	for _, el := range strings.Split(strings.Trim(rel, "/"), "/") {
		if el == "" || el == "." {
			continue
		}
		next, err := unix.Openat(fd, el, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) && create {
			if err = unix.Mkdirat(fd, el, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = unix.Openat(fd, el, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
			}
		}
		unix.Close(fd)
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return -1, fmt.Errorf("%s is not a directory (symbolic links are never followed)", rel)
		}
		if err != nil {
			return -1, fmt.Errorf("%s: %w", rel, err)
		}
		fd = next
	}
	return fd, nil
}

// emptyDir removes everything in the directory open at dfd (an opaque
// whiteout: lower layers' content of it is hidden; layers put the marker
// before the directory's own entries).
func (u *unpacker) emptyDir(dfd int, rel string) error {
	f, err := unix.Openat(dfd, ".", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(f), rel)
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := safefs.RemoveAllAt(u.ctx, dfd, n, path.Join(rel, n)); err != nil {
			return err
		}
	}
	return nil
}
