// Package oci is the example runtime's image store: it builds an OCI image
// layout (image-spec's directory format) from a directory, resolves an
// image volume's reference against a layout, and unpacks an image's layers
// into a cache directory once, safely: the layers are tenant content.
// There is no registry here; the layout plays its part.
package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// maxDocument bounds the JSON documents of a layout read into memory
// (index.json, manifests, configs).
const maxDocument = 4 << 20

// Build makes (or updates) the OCI image layout at layout with an image of
// one layer holding the files of dir, named ref (the annotation
// org.opencontainers.image.ref.name, which Resolve matches). The layer is
// reproducible: same files, same digest. Only directories, regular files
// and symbolic links are taken. It returns the manifest's descriptor.
func Build(dir, layout, ref string) (ocispec.Descriptor, error) {
	layer, diffID, err := tarGzip(dir)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	for _, d := range []string{layout, filepath.Join(layout, ocispec.ImageBlobsDir, "sha256")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return ocispec.Descriptor{}, err
		}
	}
	layerDesc, err := writeBlob(layout, ocispec.MediaTypeImageLayerGzip, layer)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	config, _ := json.Marshal(ocispec.Image{
		Platform: ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{diffID}},
	})
	configDesc, err := writeBlob(layout, ocispec.MediaTypeImageConfig, config)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	manifest, _ := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: configDesc, Layers: []ocispec.Descriptor{layerDesc},
	})
	desc, err := writeBlob(layout, ocispec.MediaTypeImageManifest, manifest)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc.Annotations = map[string]string{ocispec.AnnotationRefName: ref}

	index := ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex}
	if old, err := readIndex(layout); err == nil {
		for _, m := range old.Manifests {
			if m.Annotations[ocispec.AnnotationRefName] != ref {
				index.Manifests = append(index.Manifests, m)
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return ocispec.Descriptor{}, err
	}
	index.Manifests = append(index.Manifests, desc)
	data, _ := json.MarshalIndent(index, "", "  ")
	if err := writeFileAtomic(filepath.Join(layout, ocispec.ImageIndexFile), data); err != nil {
		return ocispec.Descriptor{}, err
	}
	data, _ = json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	return desc, writeFileAtomic(filepath.Join(layout, ocispec.ImageLayoutFile), data)
}

// tarGzip archives dir's tree (names relative to it, owner root, times
// zero) and returns the gzipped archive and the digest of the archive
// itself (the layer's diff ID).
func tarGzip(dir string) ([]byte, digest.Digest, error) {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		names = append(names, p)
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	sort.Strings(names)
	for _, p := range names {
		info, err := os.Lstat(p)
		if err != nil {
			return nil, "", err
		}
		rel, _ := filepath.Rel(dir, p)
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: int64(info.Mode().Perm()), Format: tar.FormatPAX}
		switch t := info.Mode().Type(); t {
		case fs.ModeDir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case 0:
			h.Typeflag, h.Size = tar.TypeReg, info.Size()
		case fs.ModeSymlink:
			h.Typeflag = tar.TypeSymlink
			if h.Linkname, err = os.Readlink(p); err != nil {
				return nil, "", err
			}
		default:
			return nil, "", fmt.Errorf("%s: only directories, files and symbolic links go into an image (not %s)", p, t)
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, "", err
		}
		if h.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return nil, "", err
			}
			_, err = io.CopyN(tw, f, h.Size)
			f.Close()
			if err != nil {
				return nil, "", err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, "", err
	}
	diffID := digest.FromBytes(raw.Bytes())
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return nil, "", err
	}
	if err := zw.Close(); err != nil {
		return nil, "", err
	}
	return gz.Bytes(), diffID, nil
}

func writeBlob(layout, mediaType string, data []byte) (ocispec.Descriptor, error) {
	d := digest.FromBytes(data)
	desc := ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(data))}
	return desc, writeFileAtomic(blobPath(layout, d), data)
}

func blobPath(layout string, d digest.Digest) string {
	return filepath.Join(layout, ocispec.ImageBlobsDir, d.Algorithm().String(), d.Encoded())
}

func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func readIndex(layout string) (*ocispec.Index, error) {
	data, err := readBounded(filepath.Join(layout, ocispec.ImageIndexFile), maxDocument)
	if err != nil {
		return nil, err
	}
	var index ocispec.Index
	if err := json.Unmarshal(data, &index); err != nil {
		return nil, fmt.Errorf("%s: %w", ocispec.ImageIndexFile, err)
	}
	return &index, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return data, nil
}

// ErrNotFound: the layout has no image of that reference.
var ErrNotFound = errors.New("no such image in the layout")

// Resolve finds the manifest of ref in the layout at layout: the one
// whose org.opencontainers.image.ref.name annotation is ref, or, for a
// reference by digest (name@sha256:...), the one with that digest.
func Resolve(layout, ref string) (ocispec.Descriptor, error) {
	index, err := readIndex(layout)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("reading the image layout %s: %w", layout, err)
	}
	var byDigest digest.Digest
	if _, d, ok := strings.Cut(ref, "@"); ok {
		if byDigest, err = digest.Parse(d); err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("image reference %q: %w", ref, err)
		}
	}
	var found []ocispec.Descriptor
	for _, m := range index.Manifests {
		if (byDigest != "" && m.Digest == byDigest) || (byDigest == "" && m.Annotations[ocispec.AnnotationRefName] == ref) {
			found = append(found, m)
		}
	}
	switch {
	case len(found) == 0:
		return ocispec.Descriptor{}, fmt.Errorf("%w: %q in %s", ErrNotFound, ref, layout)
	case len(found) > 1 && byDigest == "":
		return ocispec.Descriptor{}, fmt.Errorf("image reference %q names %d manifests in %s", ref, len(found), layout)
	case found[0].MediaType != ocispec.MediaTypeImageManifest:
		return ocispec.Descriptor{}, fmt.Errorf("image reference %q is a %s; this example unpacks image manifests only", ref, found[0].MediaType)
	}
	return found[0], nil
}

// openBlob opens the blob of desc and returns a reader that fails unless
// what it reads has exactly the descriptor's size and digest: a layout's
// blobs are not trusted either.
func openBlob(layout string, desc ocispec.Descriptor) (io.ReadCloser, error) {
	if err := desc.Digest.Validate(); err != nil || desc.Digest.Algorithm() != digest.SHA256 {
		return nil, fmt.Errorf("blob digest %q: want a valid sha256 digest", desc.Digest)
	}
	f, err := os.Open(blobPath(layout, desc.Digest))
	if err != nil {
		return nil, err
	}
	return &verifier{f: f, r: io.LimitReader(f, desc.Size+1), h: sha256.New(), want: desc}, nil
}

type verifier struct {
	f    *os.File
	r    io.Reader
	h    hash.Hash
	n    int64
	want ocispec.Descriptor
}

func (v *verifier) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	if v.n > v.want.Size {
		return n, fmt.Errorf("blob %s is larger than its descriptor says (%d bytes)", v.want.Digest, v.want.Size)
	}
	if errors.Is(err, io.EOF) {
		if v.n != v.want.Size {
			return n, fmt.Errorf("blob %s has %d bytes, its descriptor says %d", v.want.Digest, v.n, v.want.Size)
		}
		if got := hex.EncodeToString(v.h.Sum(nil)); got != v.want.Digest.Encoded() {
			return n, fmt.Errorf("blob %s has digest sha256:%s", v.want.Digest, got)
		}
	}
	return n, err
}

func (v *verifier) Close() error { return v.f.Close() }

// readDocument reads a JSON blob (manifest, config) whole, verified.
func readDocument(layout string, desc ocispec.Descriptor, out any) error {
	if desc.Size > maxDocument {
		return fmt.Errorf("%s %s is larger than %d bytes", desc.MediaType, desc.Digest, maxDocument)
	}
	r, err := openBlob(layout, desc)
	if err != nil {
		return err
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, out)
}
