package manifest

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// queued holds the events of a batch that next has not returned yet.
var queued = map[*dirWatcher][]dirEvent{}

// next returns the next event about name (or the directory when name is
// ""), skipping others, within a deadline.
func next(t *testing.T, w *dirWatcher, name string) dirEvent {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		for len(queued[w]) > 0 {
			ev := queued[w][0]
			queued[w] = queued[w][1:]
			if ev.name == name && ev.dir == (name == "") {
				return ev
			}
		}
		select {
		case evs, ok := <-w.events:
			if !ok {
				t.Fatal("watcher closed")
			}
			queued[w] = evs
		case <-deadline:
			t.Fatalf("no event for %q", name)
		}
	}
}

// The watcher tells a file that is complete (renamed into place, closed by
// its writer) from one still being written: the source reads the first
// at once and leaves the second alone until its writer is quiet.
func TestDirWatcherTellsCompleteFiles(t *testing.T) {
	dir := t.TempDir()
	w, err := newDirWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.watch(dir); err != nil {
		t.Fatal(err)
	}

	staged := filepath.Join(t.TempDir(), "staged.json")
	if err := os.WriteFile(staged, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	// t.TempDir()s share a parent filesystem, so this is a rename.
	if err := os.Rename(staged, filepath.Join(dir, "moved.json")); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, w, "moved.json"); !ev.complete() {
		t.Errorf("renamed into place: event %#x not complete", ev.mask)
	}

	f, err := os.Create(filepath.Join(dir, "written.json"))
	if err != nil {
		t.Fatal(err)
	}
	if ev := next(t, w, "written.json"); ev.complete() {
		t.Errorf("just created: event %#x complete", ev.mask)
	}
	if _, err := f.WriteString(`{"kind":`); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, w, "written.json"); ev.complete() {
		t.Errorf("half written: event %#x complete", ev.mask)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, w, "written.json"); !ev.complete() {
		t.Errorf("closed by its writer: event %#x not complete", ev.mask)
	}

	if err := os.Remove(filepath.Join(dir, "moved.json")); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, w, "moved.json"); ev.complete() {
		t.Errorf("removed: event %#x complete (a removal must wait: an editor may be replacing the file)", ev.mask)
	}

	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, w, ""); !ev.lost() {
		t.Errorf("directory renamed: event %#x does not lose the watch", ev.mask)
	}
}

// Close ends the reader even when nobody takes its events.
func TestDirWatcherCloseWithUnreadEvents(t *testing.T) {
	dir := t.TempDir()
	w, err := newDirWatcher()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.watch(dir); err != nil {
		t.Fatal(err)
	}
	for i := range 200 { // more than the channel holds
		if err := os.WriteFile(filepath.Join(dir, "f"+string(rune('a'+i%26))+".json"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-w.events:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("events channel not closed after Close")
		}
	}
}
