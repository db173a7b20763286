package disklimit

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// fakeQuota is the kernel as the bookkeeping sees it: directories with
// project IDs (a directory exists when it is in projects), limits and
// usage per ID.
type fakeQuota struct {
	projects map[string]uint32
	quotas   map[uint32]Quota
	// failSetProject makes SetProject fail (a crash between recording and
	// setting, as far as the directory is concerned).
	failSetProject bool
}

func newFake() *fakeQuota {
	return &fakeQuota{projects: map[string]uint32{}, quotas: map[uint32]Quota{}}
}

func (f *fakeQuota) Enforced(string) error { return nil }
func (f *fakeQuota) Project(dir string) (uint32, error) {
	id, ok := f.projects[dir]
	if !ok {
		return 0, fs.ErrNotExist
	}
	return id, nil
}
func (f *fakeQuota) SetProject(dir string, id uint32) error {
	if f.failSetProject {
		return errors.New("injected")
	}
	f.projects[dir] = id
	return nil
}
func (f *fakeQuota) SetLimit(_ string, id uint32, b int64) error {
	q := f.quotas[id]
	q.LimitBytes = b
	f.quotas[id] = q
	return nil
}
func (f *fakeQuota) Quota(_ string, id uint32) (Quota, error) { return f.quotas[id], nil }

// rename is the plugin's rename of the prepared directory into place.
func (f *fakeQuota) rename(from, to string) {
	f.projects[to] = f.projects[from]
	delete(f.projects, from)
}

const first, last = 10, 12

func TestProjects(t *testing.T) {
	type step struct {
		do   string // assign, release, restart, remove (the directory), use (charge bytes), failset
		dir  string
		want uint32 // assign: the ID
	}
	for _, tc := range []struct {
		name    string
		steps   []step
		wantIDs map[uint32]string
		// wantLimits are the IDs with a limit at the end.
		wantLimits []uint32
	}{
		{name: "allocated in order, freed, reused after free",
			steps: []step{
				{do: "assign", dir: "/a", want: 10}, {do: "assign", dir: "/b", want: 11},
				{do: "remove", dir: "/a"}, {do: "release", dir: "/a"},
				{do: "assign", dir: "/c", want: 12}, {do: "assign", dir: "/d", want: 10},
			},
			wantIDs: map[uint32]string{10: "/d", 11: "/b", 12: "/c"}, wantLimits: []uint32{10, 11, 12}},
		{name: "assign again keeps the ID",
			steps:   []step{{do: "assign", dir: "/a", want: 10}, {do: "assign", dir: "/a", want: 10}},
			wantIDs: map[uint32]string{10: "/a"}, wantLimits: []uint32{10}},
		{name: "kept over a restart",
			steps: []step{
				{do: "assign", dir: "/a", want: 10}, {do: "assign", dir: "/b", want: 11},
				{do: "restart"}, {do: "assign", dir: "/a", want: 10}, {do: "assign", dir: "/c", want: 12},
			},
			wantIDs: map[uint32]string{10: "/a", 11: "/b", 12: "/c"}, wantLimits: []uint32{10, 11, 12}},
		{name: "crash between record and set: freed at restart, not leaked",
			steps: []step{
				{do: "failset"}, {do: "assign", dir: "/a"}, {do: "restart"},
				{do: "assign", dir: "/b", want: 10},
			},
			wantIDs: map[uint32]string{10: "/b"}, wantLimits: []uint32{10}},
		{name: "crash between removal and release: freed at restart",
			steps: []step{
				{do: "assign", dir: "/a", want: 10}, {do: "remove", dir: "/a"}, {do: "restart"},
			},
			wantIDs: map[uint32]string{}},
		{name: "an ID with bytes still charged is not given again",
			steps: []step{
				{do: "assign", dir: "/a", want: 10}, {do: "use", dir: "/a"}, {do: "remove", dir: "/a"}, {do: "release", dir: "/a"},
				{do: "assign", dir: "/b", want: 11},
			},
			wantIDs: map[uint32]string{11: "/b"}, wantLimits: []uint32{11}},
		{name: "all IDs taken",
			steps: []step{
				{do: "assign", dir: "/a", want: 10}, {do: "assign", dir: "/b", want: 11}, {do: "assign", dir: "/c", want: 12},
				{do: "assign", dir: "/d", want: 0},
			},
			wantIDs: map[uint32]string{10: "/a", 11: "/b", 12: "/c"}, wantLimits: []uint32{10, 11, 12}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := newFake()
			state := t.TempDir()
			p, err := newProjects(q, "/", state, nil, first, last)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tc.steps {
				switch s.do {
				case "failset":
					q.failSetProject = true
				case "assign":
					tmp := filepath.Join(filepath.Dir(s.dir), "."+filepath.Base(s.dir)+".setup")
					id, err := p.Assign(tmp, s.dir, 1<<20)
					if q.failSetProject || s.want == 0 {
						if err == nil {
							t.Fatalf("step %d: assign %s: no error", i, s.dir)
						}
						q.failSetProject = false
						continue
					}
					if err != nil || id != s.want {
						t.Fatalf("step %d: assign %s = %d, %v; want %d", i, s.dir, id, err, s.want)
					}
					q.rename(tmp, s.dir)
				case "release":
					if err := p.Release(s.dir); err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
				case "remove":
					delete(q.projects, s.dir)
				case "use":
					qq := q.quotas[q.projects[s.dir]]
					qq.Bytes = 4096
					q.quotas[q.projects[s.dir]] = qq
				case "restart":
					if p, err = newProjects(q, "/", state, nil, first, last); err != nil {
						t.Fatalf("step %d: restart: %v", i, err)
					}
				}
			}
			got := p.IDs()
			if len(got) != len(tc.wantIDs) {
				t.Errorf("IDs %v, want %v", got, tc.wantIDs)
			}
			for id, d := range tc.wantIDs {
				if got[id] != d {
					t.Errorf("IDs %v, want %v", got, tc.wantIDs)
				}
			}
			// The records on disk are the IDs, nothing more.
			entries, _ := os.ReadDir(state)
			if len(entries) != len(tc.wantIDs) {
				t.Errorf("records on disk: %d, want %d", len(entries), len(tc.wantIDs))
			}
			var limited []uint32
			for id, qq := range q.quotas {
				if qq.LimitBytes != 0 {
					limited = append(limited, id)
				}
			}
			if len(limited) != len(tc.wantLimits) {
				t.Errorf("IDs with limits %v, want %v", limited, tc.wantLimits)
			}
		})
	}
}

func TestChoose(t *testing.T) {
	noQuota := errors.New("ENOSYS")
	for _, tc := range []struct {
		mode     Mode
		quotaErr error
		want     Kind
		wantErr  bool
	}{
		{ModeAuto, nil, KindQuota, false},
		{ModeAuto, noQuota, KindImage, false},
		{ModeQuota, nil, KindQuota, false},
		{ModeQuota, noQuota, "", true},
		{ModeImage, nil, KindImage, false},
		{ModeOff, nil, KindNone, false},
	} {
		st, err := Choose(tc.mode, tc.quotaErr)
		if (err != nil) != tc.wantErr || st.Kind != tc.want {
			t.Errorf("Choose(%s, %v) = %v, %v; want %s (error %v)", tc.mode, tc.quotaErr, st, err, tc.want, tc.wantErr)
		}
	}
	if _, err := ParseMode("bogus"); err == nil {
		t.Error("ParseMode(bogus): no error")
	}
}
