package subpath

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Validate checks a sub-path the way the kubelet does before using it: it
// must be relative and must not contain a ".." element. It returns the path
// cleaned ("a//b/./c" → "a/b/c"; "" and "." → "."), the form compared and
// resolved everywhere else.
func Validate(sub string) (string, error) {
	if path.IsAbs(sub) {
		return "", fmt.Errorf("subPath %q must not be an absolute path", sub)
	}
	for _, elem := range strings.Split(sub, "/") {
		if elem == ".." {
			return "", fmt.Errorf("subPath %q must not contain '..'", sub)
		}
	}
	if strings.ContainsRune(sub, 0) {
		return "", fmt.Errorf("subPath %q contains a NUL byte", sub)
	}
	return path.Clean(sub), nil
}

// maxSymlinks bounds the symbolic links one resolution follows, as the
// kernel does (ELOOP after 40).
const maxSymlinks = 40

// noOpenat2 is set once openat2(2) turned out to be missing (kernels before
// 5.6); tests set it to exercise the fallback walk.
var noOpenat2 atomic.Bool

// errEscapes is what resolving a path that leaves the volume returns.
var errEscapes = errors.New("leaves the volume (through a symbolic link or '..')")

// openBeneath opens sub (already validated) below the directory root as an
// O_PATH descriptor, following symbolic links only while they stay below
// root: an absolute link, or one whose ".." would climb out of root, fails
// with errEscapes. No path is ever resolved by name outside root, so a
// component swapped for a link at any moment cannot make it open anything
// outside. The result is the same with openat2(2) (RESOLVE_BENEATH: the
// kernel does it atomically) and without (a walk over descriptors).
func openBeneath(root int, sub string) (int, error) {
	if !noOpenat2.Load() {
		fd, err := unix.Openat2(root, sub, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
		})
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.ENOSYS):
			noOpenat2.Store(true)
		case errors.Is(err, unix.EXDEV):
			return -1, errEscapes
		case errors.Is(err, unix.EAGAIN):
			// RESOLVE_BENEATH refuses to go on when a rename anywhere on
			// the system could have moved a ".." it followed: the walk
			// below gives the same answer without that limit.
		default:
			return -1, err
		}
	}
	return walkBeneath(root, sub)
}

// walkBeneath resolves sub below root one component at a time, each opened
// with O_NOFOLLOW relative to the descriptor of its parent. A symbolic link
// is read from its own descriptor and its target spliced into the rest of
// the path; ".." pops the stack of descriptors walked so far and may not pop
// root itself.
func walkBeneath(root int, sub string) (int, error) {
	first, err := unix.Openat(root, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	stack := []int{first}
	defer func() {
		for _, fd := range stack {
			unix.Close(fd)
		}
	}()
	rest := splitPath(sub)
	links := 0
	for len(rest) > 0 {
		elem := rest[0]
		rest = rest[1:]
		switch elem {
		case "", ".":
			continue
		case "..":
			if len(stack) == 1 {
				return -1, errEscapes
			}
			unix.Close(stack[len(stack)-1])
			stack = stack[:len(stack)-1]
			continue
		}
		fd, err := unix.Openat(stack[len(stack)-1], elem, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return -1, err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			stack = append(stack, fd)
			continue
		}
		links++
		target, err := readlinkFd(fd)
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		if links > maxSymlinks {
			return -1, unix.ELOOP
		}
		if strings.HasPrefix(target, "/") {
			return -1, errEscapes
		}
		rest = append(splitPath(target), rest...)
	}
	fd := stack[len(stack)-1]
	stack = stack[:len(stack)-1]
	return fd, nil
}

func splitPath(p string) []string { return strings.Split(p, "/") }

// readlinkFd reads the target of the symbolic link fd (opened O_PATH |
// O_NOFOLLOW) refers to.
func readlinkFd(fd int) (string, error) {
	for size := 256; size <= 1<<16; size *= 4 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(fd, "", buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
	return "", unix.ENAMETOOLONG
}

// openOrCreateDirs opens sub below root like openBeneath and, when it does
// not exist, creates the missing directories the way the kubelet does:
// each new level is made with mkdirat in the descriptor of its parent,
// opened again with O_NOFOLLOW (whatever replaced it meanwhile is not
// followed) and given mode with fchmod (the umask does not apply). The
// existing prefix is found with openBeneath, so it may contain links that
// stay inside the volume, never ones that leave it.
func openOrCreateDirs(root int, sub string, mode uint32) (int, error) {
	fd, err := openBeneath(root, sub)
	if err == nil || !errors.Is(err, unix.ENOENT) || sub == "." {
		return fd, err
	}
	elems := strings.Split(sub, "/")
	// Find the longest prefix that exists.
	existing := len(elems) - 1
	var parent int
	for ; existing >= 0; existing-- {
		prefix := "."
		if existing > 0 {
			prefix = strings.Join(elems[:existing], "/")
		}
		parent, err = openBeneath(root, prefix)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.ENOENT) {
			return -1, err
		}
	}
	if existing < 0 {
		return -1, unix.ENOENT
	}
	for _, elem := range elems[existing:] {
		if err := unix.Mkdirat(parent, elem, mode); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(parent)
			return -1, &os.PathError{Op: "mkdirat", Path: elem, Err: err}
		}
		next, err := unix.Openat(parent, elem, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(parent)
		if err != nil {
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				return -1, fmt.Errorf("%q is not a directory (it may have been replaced while being created): %w", elem, err)
			}
			return -1, &os.PathError{Op: "openat", Path: elem, Err: err}
		}
		if err := unix.Fchmod(next, mode); err != nil {
			unix.Close(next)
			return -1, &os.PathError{Op: "fchmod", Path: elem, Err: err}
		}
		parent = next
	}
	return parent, nil
}
