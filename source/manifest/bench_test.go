package manifest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// benchPod is a small pod with four emptyDir volumes.
func benchPod(i int) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Pod
metadata:
  name: pod-%04d
  namespace: bench
  labels:
    app: bench
spec:
  nodeName: node-1
  containers:
  - name: main
    image: registry.example.com/app:1.0
    volumeMounts:
    - {name: cache, mountPath: /cache}
    - {name: tmp, mountPath: /tmp}
    - {name: data, mountPath: /data}
    - {name: shm, mountPath: /dev/shm}
  volumes:
  - name: cache
    emptyDir: {}
  - name: tmp
    emptyDir: {sizeLimit: 64Mi}
  - name: data
    emptyDir: {}
  - name: shm
    emptyDir: {medium: Memory}
`, i)
}

const benchFiles = 500

func writeBenchFiles(b *testing.B, dir string, contents [][]byte) {
	for i, c := range contents {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("pod-%04d.yaml", i)), c, 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

func benchContents() [][]byte {
	c := make([][]byte, benchFiles)
	for i := range c {
		c[i] = benchPod(i)
	}
	return c
}

// BenchmarkLoad500Pods measures how long 500 pod files take to become
// visible. "read" is the first read of a directory holding them; "watch"
// writes them into a watched directory and reports, besides the time from
// the first write, the delay after the last write (ms-after-last-write).
func BenchmarkLoad500Pods(b *testing.B) {
	contents := benchContents()

	b.Run("read", func(b *testing.B) {
		dir := b.TempDir()
		writeBenchFiles(b, dir, contents)
		b.ReportAllocs()
		for b.Loop() {
			s := newSource(b, dir, "node-1", nil)
			s.scan(nil, nil, false)
			if n := len(s.Pods()); n != benchFiles {
				b.Fatalf("%d pods", n)
			}
		}
	})

	b.Run("watch", func(b *testing.B) {
		var afterLast time.Duration
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			dir := b.TempDir()
			s := newSource(b, dir, "node-1", nil)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			for !s.HasSynced() {
				<-s.Changed()
			}
			b.StartTimer()

			writeBenchFiles(b, dir, contents)
			last := time.Now()
			timeout := time.After(10 * time.Second)
			for len(s.Pods()) != benchFiles {
				select {
				case <-s.Changed():
				case <-timeout:
					b.Fatalf("only %d pods visible", len(s.Pods()))
				}
			}
			afterLast += time.Since(last)

			b.StopTimer()
			cancel()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(afterLast.Microseconds())/1000/float64(b.N), "ms-after-last-write")
	})
}

// BenchmarkParsePod measures parsing alone, for one pod file.
func BenchmarkParsePod(b *testing.B) {
	data := benchPod(1)
	p := parser{nodeName: "node-1"}
	b.ReportAllocs()
	for b.Loop() {
		if r := p.parse(data); r.fatal != "" || len(r.objects) != 1 {
			b.Fatal(r.fatal)
		}
	}
}

// BenchmarkParsePodJSON measures parsing alone for one pod file in JSON,
// the form tools (and mountbench) write.
func BenchmarkParsePodJSON(b *testing.B) {
	data := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p1","namespace":"b","uid":"u-1"},"spec":{"nodeName":"node-1","containers":[{"name":"c","image":"x","volumeMounts":[{"name":"v0","mountPath":"/v0"},{"name":"v1","mountPath":"/v1"},{"name":"v2","mountPath":"/v2"},{"name":"v3","mountPath":"/v3"}]}],"volumes":[{"name":"v0","emptyDir":{"medium":"Memory"}},{"name":"v1","emptyDir":{"medium":"Memory"}},{"name":"v2","emptyDir":{"medium":"Memory"}},{"name":"v3","emptyDir":{"medium":"Memory"}}]}}`)
	p := parser{nodeName: "node-1"}
	b.ReportAllocs()
	for b.Loop() {
		if r := p.parse(data); r.fatal != "" || len(r.objects) != 1 {
			b.Fatal(r.fatal)
		}
	}
}
