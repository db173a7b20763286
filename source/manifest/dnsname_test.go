package manifest

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// checkDNS1123 fails t unless the fast checks give the apimachinery
// functions' answers, messages included, for s.
func checkDNS1123(t *testing.T, s string) {
	t.Helper()
	if got, want := isDNS1123Label(s), validation.IsDNS1123Label(s); !reflect.DeepEqual(got, want) {
		t.Fatalf("isDNS1123Label(%q) = %q, apimachinery says %q", s, got, want)
	}
	if got, want := isDNS1123Subdomain(s), validation.IsDNS1123Subdomain(s); !reflect.DeepEqual(got, want) {
		t.Fatalf("isDNS1123Subdomain(%q) = %q, apimachinery says %q", s, got, want)
	}
	// The loops alone, within the lengths they are asked about.
	if got, want := validLabel(s), validation.IsDNS1123Label(s) == nil; len(s) <= 63 && got != want {
		t.Fatalf("validLabel(%q) = %v", s, got)
	}
	if got, want := validSubdomain(s), validation.IsDNS1123Subdomain(s) == nil; len(s) <= 253 && got != want {
		t.Fatalf("validSubdomain(%q) = %v", s, got)
	}
}

func TestDNS1123Oracle(t *testing.T) {
	for _, s := range []string{
		"", "a", "-", "a-", "-a", "a-b", "0", "09-az", "A", "aB", "a_b", "a.b", ".a", "a.", "a..b",
		"my-pod", "default", "kube-system", "pod.example.com", "a.-b", "a-.b", "a\n", "\na", "a b",
		"é", strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("a.", 126) + "a",
		strings.Repeat("a.", 126) + "ab", strings.Repeat("a", 254), strings.Repeat("-", 64),
	} {
		checkDNS1123(t, s)
	}
	// Random strings over the bytes that matter, at the lengths around
	// the limits.
	r := rand.New(rand.NewPCG(1, 2))
	const alphabet = "az09-.A_ \n"
	for range 20000 {
		n := r.IntN(8)
		switch r.IntN(4) {
		case 0:
			n = 60 + r.IntN(6)
		case 1:
			n = 250 + r.IntN(6)
		}
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
			if r.IntN(3) > 0 {
				b[i] = "ab0-"[r.IntN(4)]
			}
		}
		checkDNS1123(t, string(b))
	}
}

func FuzzDNS1123(f *testing.F) {
	for _, s := range []string{"a", "a-b.c", "-a", "a.", strings.Repeat("a", 64)} {
		f.Add(s)
	}
	f.Fuzz(checkDNS1123)
}

// TestOneCommonSource holds oneCommonSource to countSources on volume
// sources with random sets of fields.
func TestOneCommonSource(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	nf := volumeSourceType.NumField()
	for range 20000 {
		var vs corev1.VolumeSource
		v := reflect.ValueOf(&vs).Elem()
		for range r.IntN(3) {
			f := v.Field(r.IntN(nf))
			if r.IntN(2) == 0 {
				f = v.FieldByName([]string{"EmptyDir", "ConfigMap", "Secret", "Projected", "PersistentVolumeClaim", "HostPath", "CSI"}[r.IntN(7)])
			}
			f.Set(reflect.New(f.Type().Elem()))
		}
		if oneCommonSource(&vs) && countSources(&vs) != 1 {
			t.Fatalf("oneCommonSource true with %d sources: %+v", countSources(&vs), vs)
		}
		if n := countSources(&vs); n == 1 && !oneCommonSource(&vs) {
			for _, name := range []string{"EmptyDir", "ConfigMap", "Secret", "Projected", "PersistentVolumeClaim", "HostPath", "CSI"} {
				if !v.FieldByName(name).IsNil() {
					t.Fatalf("oneCommonSource false with only %s set", name)
				}
			}
		}
	}
}
