package ui

import (
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/volume-agent/volume-agent/ui/model"
)

// The pictures are inline SVG laid out here and drawn by the templates:
// no script, no external asset.

// stateBar is the node's pod volumes as one bar split by state.
type stateBar struct {
	Width, Height int
	Segments      []barSegment
}

type barSegment struct {
	X, W  int
	State string
	Count int
}

func newStateBar(s model.Summary) stateBar {
	b := stateBar{Width: 1000, Height: 14}
	if s.Volumes == 0 {
		return b
	}
	x := 0
	for i, sc := range s.VolumeStates {
		w := sc.Count * b.Width / s.Volumes
		if i == len(s.VolumeStates)-1 {
			w = b.Width - x // no gap from rounding
		}
		w = max(w, 4)
		b.Segments = append(b.Segments, barSegment{X: x, W: w, State: string(sc.State), Count: sc.Count})
		x += w
	}
	return b
}

// treeLayout is a pod's mount tree: for each volume, where its data comes
// from (device or source) → its global mount, if any → the mounts of
// every pod sharing it.
type treeLayout struct {
	Width, Height int
	Columns       []treeText
	Boxes         []treeBox
	Links         []treeLink
}

type treeText struct {
	X, Y int
	Text string
}

type treeBox struct {
	X, Y, W, H int
	Class      string
	Title      string // first line
	Detail     string // second line (a path, shortened)
	Tooltip    string // the whole of it
	TitleX     int
	TitleY     int
	DetailY    int
	Href       string
}

type treeLink struct {
	D     string
	Class string
}

const (
	treeColW   = 330
	treeGap    = 60
	treeBoxH   = 40
	treeRowH   = 52
	treeHeader = 28
	// What fits in a box at the page's font sizes: titles (12px, bold)
	// and paths (11px, monospace).
	treeTitleChars  = 42
	treeDetailChars = 46
)

func newTreeLayout(d *model.PodDetail) treeLayout {
	l := treeLayout{Width: 3*treeColW + 2*treeGap + 2}
	cols := [3]int{1, 1 + treeColW + treeGap, 1 + 2*(treeColW+treeGap)}
	l.Columns = []treeText{
		{X: cols[0], Y: 16, Text: "device or source"},
		{X: cols[1], Y: 16, Text: "global (device) mount"},
		{X: cols[2], Y: 16, Text: "pod mounts"},
	}
	y := treeHeader
	for _, t := range d.Mounts {
		rows := max(len(t.Mounts), 1)
		groupH := rows * treeRowH
		mid := y + groupH/2 - treeBoxH/2
		origin := newBox(cols[0], mid, "state-"+string(t.State), t.Name+" · "+string(t.State), t.Origin)
		l.Boxes = append(l.Boxes, origin)
		from := origin
		if t.GlobalMount != "" {
			global := newBox(cols[1], mid, "global", "global mount", t.GlobalMount)
			l.Boxes = append(l.Boxes, global)
			l.Links = append(l.Links, link(origin, global, "link"))
			from = global
		}
		for i, m := range t.Mounts {
			class, title := "mount mount-"+classSafe(m.State), m.Pod.Namespace+"/"+m.Pod.Name
			if m.This {
				class += " this"
				title = "this pod"
			}
			b := newBox(cols[2], y+i*treeRowH+(treeRowH-treeBoxH)/2, class, title+" · "+m.State, cmpOr(m.Path, "not mounted"))
			b.Tooltip = m.Pod.Namespace + "/" + m.Pod.Name + " · " + m.State + "\n" + m.Path
			if !m.This {
				b.Href = podURL(m.Pod.Namespace, m.Pod.Name)
			}
			l.Boxes = append(l.Boxes, b)
			l.Links = append(l.Links, link(from, b, "link link-"+classSafe(m.State)))
		}
		y += groupH
	}
	l.Height = y + 4
	return l
}

func newBox(x, y int, class, title, detail string) treeBox {
	return treeBox{
		X: x, Y: y, W: treeColW, H: treeBoxH, Class: class,
		Title: shortenEnd(title, treeTitleChars), Detail: shortenPath(detail, treeDetailChars), Tooltip: title + "\n" + detail,
		TitleX: x + 10, TitleY: y + 16, DetailY: y + 32,
	}
}

// link is a curve from a's right edge to b's left edge.
func link(a, b treeBox, class string) treeLink {
	x1, y1 := a.X+a.W, a.Y+a.H/2
	x2, y2 := b.X, b.Y+b.H/2
	mx := (x1 + x2) / 2
	return treeLink{D: fmt.Sprintf("M%d %d C%d %d %d %d %d %d", x1, y1, mx, y1, mx, y2, x2, y2), Class: class}
}

// shortenPath keeps the end of a path, which names it.
func shortenPath(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return "…" + string(r[len(r)-n+1:])
}

func shortenEnd(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// classSafe turns a state into a CSS class suffix.
func classSafe(s string) string {
	out := []byte(s)
	for i, c := range out {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			out[i] = '-'
		}
	}
	return string(out)
}

// timelineLayout is the pod's operations on a time axis, one lane per
// volume.
type timelineLayout struct {
	Width, Height int
	PlotX, PlotW  int
	Lanes         []lane
	Ticks         []tick
	NowX          int
	AxisY         int
	Empty         bool
}

type lane struct {
	Y     int
	Label string
	Bars  []bar
}

type bar struct {
	X, Y, W, H int
	Class      string
	Tooltip    string
}

type tick struct {
	X     int
	Label string
}

const (
	timelineLabelW = 170
	timelineLaneH  = 28
	timelineBarH   = 14
)

func newTimelineLayout(d *model.PodDetail) timelineLayout {
	l := timelineLayout{Width: 1112, PlotX: timelineLabelW + 10}
	l.PlotW = l.Width - l.PlotX - 40 // room for the last tick's label
	if len(d.Timeline) == 0 {
		l.Empty = true
		return l
	}
	end := d.Now
	start := d.Timeline[0].Start
	for _, e := range d.Timeline {
		if e.Start.Before(start) {
			start = e.Start
		}
		if e.End.After(end) {
			end = e.End
		}
	}
	span := end.Sub(start)
	if span < 10*time.Second {
		span = 10 * time.Second
	}
	start = end.Add(-span - span/50) // a margin on the left
	span = end.Sub(start)
	x := func(t time.Time) int { return l.PlotX + int(float64(l.PlotW)*float64(t.Sub(start))/float64(span)) }

	lanes := map[string]int{}
	for _, e := range d.Timeline {
		i, ok := lanes[e.Name]
		if !ok {
			i = len(l.Lanes)
			lanes[e.Name] = i
			l.Lanes = append(l.Lanes, lane{Y: 8 + i*timelineLaneH, Label: shortenEnd(e.Name, 24)})
		}
		ln := &l.Lanes[i]
		x1 := x(e.Start)
		w := max(x(e.End)-x1, 4)
		tip := fmt.Sprintf("%s %s at %s (took %s)", e.Op, e.Outcome, e.End.Format("15:04:05.000"), e.End.Sub(e.Start).Round(time.Millisecond))
		if e.Pod.Name == "" {
			tip += ", for every pod of the volume"
		}
		if e.Error != "" {
			tip += "\n" + e.Error
		}
		ln.Bars = append(ln.Bars, bar{X: x1, Y: ln.Y + (timelineLaneH-timelineBarH)/2 - 2, W: w, H: timelineBarH, Class: "op-" + string(e.Outcome), Tooltip: tip})
	}
	l.AxisY = 8 + len(l.Lanes)*timelineLaneH + 4
	l.Height = l.AxisY + 22
	l.NowX = x(d.Now)
	const ticks = 5
	for i := range ticks {
		t := start.Add(span * time.Duration(i) / (ticks - 1))
		l.Ticks = append(l.Ticks, tick{X: x(t), Label: t.Format("15:04:05")})
	}
	return l
}
