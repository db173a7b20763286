package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/examples/runtime-consumer/oci"
	"github.com/volume-agent/volume-agent/runtimeapi"
)

// imageMount "pulls" an image volume's image as its policy says (from the
// layout into the cache) and checks that the mount's sub-path is in it; it
// returns the unpacked image's directory. The container side opens the
// sub-path again, in its own mount namespace (a mount cannot be bound from
// another namespace's descriptor).
func (r *runner) imageMount(ctx context.Context, m runtimeapi.Mount) (string, error) {
	if r.images == nil {
		return "", fmt.Errorf("the mount at %s is of image %s: run with -image-layout", m.ContainerPath, m.Image.Reference)
	}
	dir, err := r.images.Get(ctx, m.Image.Reference, m.Image.PullPolicy)
	if err != nil {
		return "", fmt.Errorf("image volume %s: %w", m.Volume, err)
	}
	fd, err := openInImage(dir, m.ImageSubPath)
	if err != nil {
		return "", fmt.Errorf("image volume %s (%s): %w", m.Volume, m.Image.Reference, err)
	}
	unix.Close(fd)
	return dir, nil
}

// openInImage opens (O_PATH) what a mount shows of an unpacked image: its
// root, or sub resolved inside it as if the image were the root
// (RESOLVE_IN_ROOT: an absolute link or ".." stays in the image), never
// crossing into another mount.
func openInImage(dir, sub string) (int, error) {
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(root)
	name := sub
	if name == "" {
		name = "."
	}
	fd, err := unix.Openat2(root, name, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if errors.Is(err, unix.ENOENT) {
		return -1, fmt.Errorf("sub-path %q does not exist in the image", sub)
	}
	if err != nil {
		return -1, fmt.Errorf("sub-path %q: %w", sub, err)
	}
	return fd, nil
}

// buildImage is the build-image command: a directory into an OCI image
// layout.
func buildImage(args []string) error {
	fs := flag.NewFlagSet("build-image", flag.ContinueOnError)
	from := fs.String("from", "", "the directory whose files make the image")
	layout := fs.String("layout", "", "the OCI image layout to write (made or added to)")
	ref := fs.String("ref", "", "the image's name, e.g. example.local/greeting:v1")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *from == "" || *layout == "" || *ref == "" {
		return errors.New("-from, -layout and -ref are required")
	}
	desc, err := oci.Build(*from, *layout, *ref)
	if err != nil {
		return err
	}
	fmt.Printf("%s: %s (%d bytes of manifest) in %s\n", *ref, desc.Digest, desc.Size, *layout)
	return nil
}
