package ui

import (
	"bytes"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/volume-agent/volume-agent/internal/disklimit"
	"github.com/volume-agent/volume-agent/ui/model"
)

// templates renders the views; every view is a whole page, or the
// fragment the page's script swaps in (the part under <main>).
type templates struct{ t *template.Template }

func parseTemplates() *templates {
	funcs := template.FuncMap{
		"age":       age,
		"until":     until,
		"ago":       ago,
		"countdown": countdown,
		"stamp":     stamp,
		"clock":     func(t time.Time) string { return t.Format("15:04:05") },
		"podURL":    podURL,
		"ms":        func(d time.Duration) string { return d.Round(time.Millisecond).String() },
		"took":      func(a, b time.Time) string { return took(b.Sub(a)) },
		"plural":    plural,
		"stateHelp": stateHelp,
		"join":      strings.Join,
		"plus":      func(d, x int) int { return x + d },
		"minus":     func(d, x int) int { return x - d },
		"withNow":   func(now time.Time, items any) withNow { return withNow{Now: now, Items: items} },
	}
	return &templates{t: template.Must(template.New("").Funcs(funcs).ParseFS(assets, "assets/*.html"))}
}

// age is how long ago t was, relative to now, the way kubectl shows ages.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return duration.HumanDuration(now.Sub(t))
}

// took shows an operation's duration to the millisecond, and a shorter one
// to the microsecond rather than as "0s".
func took(d time.Duration) string {
	if d < time.Millisecond {
		return d.Round(time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// until is a countdown to t.
func until(now, t time.Time) string {
	if !t.After(now) {
		return "now"
	}
	return "in " + duration.HumanDuration(t.Sub(now))
}

// ago is a <time> element with t's age, which the page's script keeps
// counting.
func ago(now, t time.Time) template.HTML {
	if t.IsZero() {
		return "—"
	}
	return template.HTML(`<time datetime="` + stamp(t) + `" data-age>` + age(now, t) + `</time>`)
}

// countdown is a <time> element counting down to t (a retry).
func countdown(now time.Time, t *time.Time) template.HTML {
	if t == nil || t.IsZero() {
		return ""
	}
	return template.HTML(`<time datetime="` + stamp(*t) + `" data-until>` + until(now, *t) + `</time>`)
}

// stamp is t as an HTML datetime attribute (the script counts from it).
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func podURL(namespace, name string) string {
	return "/pods/" + url.PathEscape(namespace) + "/" + url.PathEscape(name)
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

// stateHelp explains a volume state (the badge's tooltip).
func stateHelp(s model.State) string {
	switch s {
	case model.Desired:
		return "wanted by the pod; not set up yet"
	case model.Attached:
		return "the device is attached to the node; not mounted yet"
	case model.DeviceMounted:
		return "the device is mounted at its global path; not mounted for the pod yet"
	case model.Mounted:
		return "mounted for the pod: ready"
	case model.Uncertain:
		return "an operation may have left it half mounted; it is retried"
	case model.Error:
		return "it cannot be used: see the reason"
	case model.Unmounting:
		return "no longer wanted: being unmounted"
	}
	return ""
}

// withNow hands a list to a sub-template with the time ages count from.
type withNow struct {
	Now   time.Time
	Items any
}

// view is what a template renders.
type view struct {
	Kind         string // main, pod, missing
	Title        string
	Fragment     bool
	Now          time.Time
	Node         string
	Mode         string
	SourcesReady bool
	Limits       disklimit.Status
	Stream       string
	Summary      model.Summary
	Bar          stateBar

	// main
	Page       *model.Page
	Filter     model.Filter
	Filtered   bool
	AllPods    int
	Namespaces []string
	States     []string

	// pod
	Pod      *model.PodDetail
	Tree     treeLayout
	Timeline timelineLayout
	// Recent is the pod's timeline newest first.
	Recent []model.TimelineEntry

	// missing
	Missing string
}

func baseView(kind string, page *model.Page, stream string, fragment bool) view {
	return view{
		Kind: kind, Fragment: fragment, Now: page.Now, Node: page.Node, Mode: page.Mode, SourcesReady: page.SourcesReady, Limits: page.EmptyDirLimits,
		Stream: stream, Summary: page.Summary, Bar: newStateBar(page.Summary),
	}
}

// filterStates are the choices of the state filter.
var filterStates = func() []string {
	out := []string{model.NotReady}
	for _, s := range model.States {
		out = append(out, string(s))
	}
	return append(out, string(model.PodReady), string(model.PodWaiting), string(model.PodTerminating))
}()

func (t *templates) main(page *model.Page, f model.Filter, stream string, fragment bool) ([]byte, int, error) {
	v := baseView("main", page, stream, fragment)
	v.Title = "volumes on " + page.Node
	v.Page, v.Filter, v.Filtered, v.AllPods = page.Filtered(f), f, !f.IsZero(), len(page.Pods)
	v.Namespaces, v.States = page.Namespaces, filterStates
	return t.render(v, http.StatusOK)
}

func (t *templates) pod(page *model.Page, d *model.PodDetail, stream string, fragment bool) ([]byte, int, error) {
	v := baseView("pod", page, stream, fragment)
	v.Title = d.Pod.Namespace + "/" + d.Pod.Name + " on " + page.Node
	v.Pod, v.Tree, v.Timeline = d, newTreeLayout(d), newTimelineLayout(d)
	v.Recent = slices.Clone(d.Timeline)
	slices.Reverse(v.Recent)
	return t.render(v, http.StatusOK)
}

func (t *templates) missing(page *model.Page, namespace, name, stream string, fragment bool) ([]byte, int, error) {
	v := baseView("missing", page, stream, fragment)
	v.Missing = namespace + "/" + name
	v.Title = v.Missing + " is not on " + page.Node
	return t.render(v, http.StatusNotFound)
}

func (t *templates) render(v view, code int) ([]byte, int, error) {
	name := "layout"
	if v.Fragment {
		name = "content"
	}
	var buf bytes.Buffer
	if err := t.t.ExecuteTemplate(&buf, name, v); err != nil {
		return nil, 0, err
	}
	return buf.Bytes(), code, nil
}
