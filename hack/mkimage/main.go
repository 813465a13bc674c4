// Command mkimage packs files from the host into a single-layer container image tarball
// (docker-archive format, which `ctr images import` reads), without a container engine.
//
// Usage:
//
//	mkimage -o out.tar -t localhost/name:tag [-entrypoint "/bin/x run"] [-user 65532] [-env K=V]... ENTRY...
//
// Each ENTRY is one of
//
//	file:SRC:DST[:MODE]   copy host file SRC (symlinks followed) to DST, octal MODE (default: SRC's)
//	link:TARGET:DST       symlink DST -> TARGET
//	dir:DST[:MODE]        empty directory (default mode 0755)
//
// Every timestamp and owner is fixed, so the same inputs give the same image digest: the image
// builder can compare digests instead of re-importing.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// entryKind says what an Entry puts into the image.
type entryKind string

const (
	kindFile entryKind = "file"
	kindLink entryKind = "link"
	kindDir  entryKind = "dir"
)

// Entry is one path in the image layer.
type Entry struct {
	Kind entryKind
	// Src is the host file to copy (file), or the symlink target (link).
	Src string
	// Dst is the absolute path inside the image.
	Dst string
	// Mode is the permission bits; 0 means "take them from Src" for files, 0755 for dirs.
	Mode int64
}

// parseEntry turns one ENTRY argument into an Entry, checking what can be checked without the
// file system.
func parseEntry(spec string) (Entry, error) {
	parts := strings.Split(spec, ":")
	e := Entry{Kind: entryKind(parts[0])}
	var modeStr string
	switch e.Kind {
	case kindFile:
		if len(parts) < 3 || len(parts) > 4 {
			return Entry{}, fmt.Errorf("entry %q: want file:SRC:DST[:MODE]", spec)
		}
		e.Src, e.Dst = parts[1], parts[2]
		if len(parts) == 4 {
			modeStr = parts[3]
		}
	case kindLink:
		if len(parts) != 3 {
			return Entry{}, fmt.Errorf("entry %q: want link:TARGET:DST", spec)
		}
		e.Src, e.Dst = parts[1], parts[2]
	case kindDir:
		if len(parts) < 2 || len(parts) > 3 {
			return Entry{}, fmt.Errorf("entry %q: want dir:DST[:MODE]", spec)
		}
		e.Dst, e.Mode = parts[1], 0o755
		if len(parts) == 3 {
			modeStr = parts[2]
		}
	default:
		return Entry{}, fmt.Errorf("entry %q: unknown kind %q (want file, link or dir)", spec, parts[0])
	}
	if e.Src == "" && e.Kind != kindDir {
		return Entry{}, fmt.Errorf("entry %q: empty source", spec)
	}
	if !path.IsAbs(e.Dst) || path.Clean(e.Dst) != e.Dst || e.Dst == "/" {
		return Entry{}, fmt.Errorf("entry %q: destination %q must be a clean absolute path below /", spec, e.Dst)
	}
	if modeStr != "" {
		m, err := strconv.ParseInt(modeStr, 8, 32)
		if err != nil || m < 0 || m > 0o7777 {
			return Entry{}, fmt.Errorf("entry %q: mode %q is not octal permission bits", spec, modeStr)
		}
		e.Mode = m
	}
	return e, nil
}

// parentDirs lists every ancestor directory of the entries' destinations that no entry creates
// itself, sorted, so that the layer holds explicit directories (some unpackers need them).
func parentDirs(entries []Entry) []string {
	have := map[string]bool{}
	for _, e := range entries {
		have[e.Dst] = true
	}
	need := map[string]bool{}
	for _, e := range entries {
		for d := path.Dir(e.Dst); d != "/"; d = path.Dir(d) {
			if !have[d] {
				need[d] = true
			}
		}
	}
	out := make([]string, 0, len(need))
	for d := range need {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// epoch is every entry's timestamp: reproducible layers.
var epoch = time.Unix(0, 0).UTC()

func writeLayer(entries []Entry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := func(h *tar.Header) error {
		h.ModTime, h.Uid, h.Gid, h.Format = epoch, 0, 0, tar.FormatPAX
		return tw.WriteHeader(h)
	}
	for _, d := range parentDirs(entries) {
		if err := hdr(&tar.Header{Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, Typeflag: tar.TypeDir}); err != nil {
			return nil, err
		}
	}
	sorted := append([]Entry(nil), entries...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Dst < sorted[j].Dst })
	for _, e := range sorted {
		name := strings.TrimPrefix(e.Dst, "/")
		switch e.Kind {
		case kindDir:
			if err := hdr(&tar.Header{Name: name + "/", Mode: e.Mode, Typeflag: tar.TypeDir}); err != nil {
				return nil, err
			}
		case kindLink:
			if err := hdr(&tar.Header{Name: name, Linkname: e.Src, Mode: 0o777, Typeflag: tar.TypeSymlink}); err != nil {
				return nil, err
			}
		case kindFile:
			data, err := os.ReadFile(e.Src)
			if err != nil {
				return nil, fmt.Errorf("entry %s: %w", e.Dst, err)
			}
			mode := e.Mode
			if mode == 0 {
				st, err := os.Stat(e.Src)
				if err != nil {
					return nil, fmt.Errorf("entry %s: %w", e.Dst, err)
				}
				mode = int64(st.Mode().Perm())
			}
			if err := hdr(&tar.Header{Name: name, Mode: mode, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
				return nil, err
			}
			if _, err := tw.Write(data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	out := flag.String("o", "", "output tarball")
	tag := flag.String("t", "", "image reference, e.g. localhost/lbsvc-echo:dev")
	entrypoint := flag.String("entrypoint", "", "entrypoint, space separated")
	user := flag.String("user", "", "user (uid[:gid]) the image runs as")
	digestFile := flag.String("digest-file", "", "also write the image digest to this file")
	var env multiFlag
	flag.Var(&env, "env", "environment variable K=V (repeatable); PATH defaults to the usual dirs")
	flag.Parse()
	if *out == "" || *tag == "" || flag.NArg() == 0 {
		log.Fatal("usage: mkimage -o OUT -t REF [-entrypoint CMD] [-user UID] [-env K=V] ENTRY...")
	}
	var entries []Entry
	for _, a := range flag.Args() {
		e, err := parseEntry(a)
		if err != nil {
			log.Fatal(err)
		}
		entries = append(entries, e)
	}
	layerBytes, err := writeLayer(entries)
	if err != nil {
		log.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	})
	if err != nil {
		log.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		log.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		log.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", "amd64", v1.Time{Time: epoch}
	hasPath := false
	for _, kv := range env {
		hasPath = hasPath || strings.HasPrefix(kv, "PATH=")
	}
	if !hasPath {
		env = append(multiFlag{"PATH=/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin:/"}, env...)
	}
	cf.Config = v1.Config{Entrypoint: strings.Fields(*entrypoint), Env: env, User: *user}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		log.Fatal(err)
	}
	ref, err := name.ParseReference(*tag)
	if err != nil {
		log.Fatalf("tag %q: %v", *tag, err)
	}
	if err := tarball.WriteToFile(*out, ref, img); err != nil {
		log.Fatalf("write %s: %v", *out, err)
	}
	digest, err := img.Digest()
	if err != nil {
		log.Fatal(err)
	}
	if *digestFile != "" {
		if err := os.WriteFile(*digestFile, []byte(digest.String()+"\n"), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Printf("%s %s %s\n", *out, ref, digest)
}
