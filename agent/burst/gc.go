package burst

import (
	"math"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"

	"github.com/volume-agent/volume-agent/cache"
	"github.com/volume-agent/volume-agent/reconciler"
)

// GC lets the garbage collector run less often while a burst of work
// runs: from a read of Files manifests or more (Reading), or a pass that
// plans Actions actions or more, until a pass plans nothing. A storm's
// garbage (manifests parsed, thousands of operations) is collected
// whenever the heap has grown by the GC percent the agent keeps for its
// steady state (50, for a small resident size); each collection costs
// the whole process CPU (mark workers, assists, write barriers), and
// GOGC=off took a third of the user CPU of a 1000-pod setup away. During
// a burst the GC percent is off and a soft memory limit alone holds the
// heap, to what the steady percent would allow plus Extra: the burst's
// collections come Extra bytes further apart and the peak stays within
// Extra of what it was. (A raised percent, 400, collected first: 400 % of
// a live heap of a few MiB came before the limit, twice in a 1000-pod
// setup.) Extra follows the burst's work, up to MaxExtra: PerFile bytes
// for each file read, the parse and the operations a pod's manifest
// leads to, and PerItem for each action planned. A 1000-pod storm then
// needs no collection of its own (it allocates about 30 KiB per pod of
// four volumes), while a burst of a hundred pods keeps the peak of 8 MiB
// more.
//
// A storm's manifests are parsed before the reconciler plans anything,
// and parsing a thousand of them took two collections at the steady
// percent: so the read starts the burst. A read whose pods want no volume
// ends it at the pass that follows (it plans nothing); the reconciler
// passes at least every resync period, so a burst always ends. The limit
// follows the live heap at every pass of the burst, so it never squeezes
// a heap that grew into collecting without end. Once steady, the
// process's settings come back (before the trimmer returns the heap to
// the kernel).
type GC struct {
	opts GCOptions

	mu       sync.Mutex
	bursting bool
	// steadyPercent and steadyLimit are the settings a burst replaced.
	steadyPercent int
	steadyLimit   int64
	limit         int64
	// work is what the files read and actions planned since the burst
	// began may allocate (PerFile and PerItem each); Extra follows it.
	work  int64
	extra int64
	// live is the live heap the limit was computed from: it changes only
	// when a collection ends, and setting a limit stops the world.
	live    uint64
	samples []metrics.Sample
}

// GCOptions tune a GC; zero fields get the defaults.
type GCOptions struct {
	// Actions is how many actions in one pass make a burst (default 64).
	Actions int
	// Files is how many manifest files in one read make a burst
	// (default 32).
	Files int
	// Percent is the GC percent during a burst (default -1, off: the
	// memory limit alone decides).
	Percent int
	// Extra is how much more the heap may grow during a burst than the
	// steady GC percent lets it (default 8 MiB). The burst's work raises
	// it up to MaxExtra (default 64 MiB): PerFile for each manifest file
	// read (default 24 KiB, a little less than a 1000x4 emptyDir setup
	// allocates per pod, from its parse to its last mount) and PerItem
	// for each action planned (default 6 KiB, what a teardown allocates
	// per volume, with room).
	Extra, PerFile, PerItem, MaxExtra int64
}

// NewGC returns the burst tuning of the process's GC; nil (the agent's
// GC settings come from the environment, or several agents share a test
// process) leaves the GC alone.
func NewGC(o GCOptions) *GC {
	if o.Actions <= 0 {
		o.Actions = 64
	}
	if o.Percent == 0 {
		o.Percent = -1
	}
	if o.Files <= 0 {
		o.Files = 32
	}
	if o.Extra <= 0 {
		o.Extra = 8 << 20
	}
	if o.PerFile <= 0 {
		o.PerFile = 24 << 10
	}
	if o.PerItem <= 0 {
		o.PerItem = 6 << 10
	}
	if o.MaxExtra <= 0 {
		o.MaxExtra = 64 << 20
	}
	o.MaxExtra = max(o.MaxExtra, o.Extra)
	return &GC{opts: o, samples: []metrics.Sample{
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/gc/heap/live:bytes"},
	}}
}

var _ reconciler.Observer = (*GC)(nil)

// Reconciled implements reconciler.Observer.
func (g *GC) Reconciled(_ *cache.DesiredSnapshot, _ *cache.ActualSnapshot, actions []reconciler.Action, _ time.Duration) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case len(actions) == 0 && g.bursting:
		g.bursting = false
		debug.SetGCPercent(g.steadyPercent)
		debug.SetMemoryLimit(g.steadyLimit)
	case len(actions) >= g.opts.Actions && !g.bursting:
		g.start(int64(len(actions)) * g.opts.PerItem)
	case len(actions) > 0 && g.bursting:
		g.work += int64(len(actions)) * g.opts.PerItem
		g.follow(false)
	}
}

// Reading is told, by the manifest source, that a read is about to parse
// files manifests: a large read starts a burst before the reconciler
// plans its work (see GC).
func (g *GC) Reading(files int) {
	if g == nil || files <= 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.bursting:
		g.work += int64(files) * g.opts.PerFile
		g.follow(false)
	case files >= g.opts.Files:
		g.start(int64(files) * g.opts.PerFile)
	}
}

// start begins a burst whose work may allocate work bytes. g.mu must be
// held.
func (g *GC) start(work int64) {
	g.bursting = true
	g.steadyPercent = debug.SetGCPercent(g.opts.Percent)
	g.steadyLimit = debug.SetMemoryLimit(-1)
	g.limit, g.work = 0, work
	g.follow(true)
}

// follow raises the memory limit, after each collection or as the work
// grows, to what the heap may reach now: the Go memory outside heap
// objects, plus the heap goal the steady GC percent gives the live heap,
// plus the burst's extra. It never lowers it within a burst, and never
// above the process's own limit. g.mu must be held.
func (g *GC) follow(first bool) {
	metrics.Read(g.samples)
	total, released, objects, live := g.samples[0].Value.Uint64(), g.samples[1].Value.Uint64(), g.samples[2].Value.Uint64(), g.samples[3].Value.Uint64()
	extra := g.extraFor(g.work)
	if live == g.live && extra == g.extra && !first {
		return
	}
	g.live, g.extra = live, extra
	limit := extra + clampInt64(total-released-min(objects, total-released))
	if g.steadyPercent > 0 {
		limit += clampInt64(live + live*uint64(g.steadyPercent)/100)
	} else {
		// GC off in the steady state: nothing to hold the burst to
		// but the process's own limit.
		limit = math.MaxInt64
	}
	limit = min(max(limit, g.limit), g.steadyLimit)
	if limit != g.limit {
		g.limit = limit
		debug.SetMemoryLimit(limit)
	}
}

// extraFor is how much more than the steady goal the heap may grow in a
// burst whose work may allocate work bytes: Extra, or work, up to
// MaxExtra. Rounded down to MiB, so that a few more items do not stop the
// world to set a limit a few KiB higher.
func (g *GC) extraFor(work int64) int64 {
	return min(g.opts.MaxExtra, max(g.opts.Extra, work&^(1<<20-1)))
}

func clampInt64(v uint64) int64 {
	if v > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(v)
}
