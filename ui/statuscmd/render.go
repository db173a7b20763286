package statuscmd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/volume-agent/volume-agent/status/events"
	"github.com/volume-agent/volume-agent/ui/model"
)

// options say how to print.
type options struct {
	wide bool
	json bool
}

// maxText bounds a reason or error in the default output (--output wide
// prints it whole).
const maxText = 120

// table writes aligned columns, like kubectl.
type table struct {
	out io.Writer
	buf bytes.Buffer
	tw  *tabwriter.Writer
}

func newTable(w io.Writer, headers ...string) *table {
	t := &table{out: w}
	t.tw = tabwriter.NewWriter(&t.buf, 0, 8, 3, ' ', 0)
	if len(headers) > 0 {
		t.row(headers...)
	}
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		if i > 0 {
			t.tw.Write([]byte{'\t'})
		}
		t.tw.Write([]byte(strings.ReplaceAll(c, "\t", " ")))
	}
	t.tw.Write([]byte{'\n'})
}

// flush writes the table without the padding after the last cell.
func (t *table) flush() error {
	if err := t.tw.Flush(); err != nil {
		return err
	}
	var out bytes.Buffer
	for line := range bytes.Lines(t.buf.Bytes()) {
		out.Write(bytes.TrimRight(line, " \n"))
		out.WriteByte('\n')
	}
	_, err := t.out.Write(out.Bytes())
	return err
}

// sanitize makes text from the agent (which tenants may control: file
// names, error messages) safe for a terminal: one line, no control
// characters (escape sequences would drive the terminal).
func sanitize(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return unicode.IsControl(r) || r == utf8.RuneError }) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\n' || r == '\r' || r == '\t':
			b.WriteByte(' ')
		case unicode.IsControl(r) || r == utf8.RuneError:
			fmt.Fprintf(&b, "\\x%02x", r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func (o options) text(s string) string {
	s = sanitize(s)
	if !o.wide && utf8.RuneCountInString(s) > maxText {
		s = string([]rune(s)[:maxText-1]) + "…"
	}
	return cellOr(s, "")
}

func cellOr(s, empty string) string {
	if s == "" {
		return empty
	}
	return s
}

func age(now, t time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t))
}

func until(now time.Time, t *time.Time) string {
	if t == nil {
		return "-"
	}
	if !t.After(now) {
		return "now"
	}
	return "in " + duration.HumanDuration(t.Sub(now))
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// page prints the node's page.
func (o options) page(w io.Writer, p *model.Page) error {
	if o.json {
		return writeJSON(w, p)
	}
	now := p.Now
	s := p.Summary
	sources := "ready"
	if !p.SourcesReady {
		sources = "NOT READY (nothing is unmounted until they are)"
	}
	var states []string
	for _, sc := range s.VolumeStates {
		states = append(states, fmt.Sprintf("%d %s", sc.Count, sc.State))
	}
	fmt.Fprintf(w, "Node %s (%s), sources %s\n", sanitize(p.Node), p.Mode, sources)
	fmt.Fprintf(w, "Pods %d: %d ready, %d waiting, %d failing, %d terminating. Volumes %d: %s.\n",
		s.Pods, s.PodsReady, s.PodsWaiting, s.PodsError, s.PodsTerminating, s.Volumes, cellOr(strings.Join(states, ", "), "none"))
	fmt.Fprintf(w, "Operations: %d running, %d in backoff. CSI drivers %d (%d unresponsive). Orphans %d.\n\n",
		s.OperationsRunning, s.OperationsBackoff, s.Drivers, s.DriversUnhealthy, s.Orphans)

	if len(p.Pods) == 0 {
		fmt.Fprintln(w, "No pods found.")
	} else {
		headers := []string{"NAMESPACE", "POD", "VOLUME", "STATE", "AGE", "REASON"}
		if o.wide {
			headers = []string{"NAMESPACE", "POD", "POD STATE", "VOLUME", "SOURCE", "STATE", "AGE", "REASON", "MOUNT PATH"}
		}
		t := newTable(w, headers...)
		for _, pod := range p.Pods {
			if len(pod.Volumes) == 0 {
				o.podRow(t, pod, model.PodVolume{Name: "<none>", State: model.State(pod.State), Since: pod.Since, Reason: pod.Reason}, now)
			}
			for _, v := range pod.Volumes {
				o.podRow(t, pod, v, now)
			}
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	o.operations(w, p.Operations, now)
	if len(p.Drivers) > 0 {
		fmt.Fprintln(w, "\nCSI DRIVERS")
		t := newTable(w, "NAME", "HEALTH", "IN CLUSTER", "ENDPOINT", "SOURCE", "VERSION", "REGISTERED", "LAST PROBE", "LAST ERROR")
		for _, d := range p.Drivers {
			t.row(sanitize(d.Name), d.Health, cellOr(d.InCluster, "-"), sanitize(d.Endpoint), d.Source, cellOr(sanitize(d.Version), "-"),
				age(now, d.RegisteredAt), age(now, d.LastProbe), cellOr(o.text(d.InClusterError), "-"))
		}
		t.flush()
	}
	if len(p.Sockets) > 0 {
		fmt.Fprintln(w, "\nREGISTRATION SOCKETS NOT REGISTERED")
		t := newTable(w, "SOCKET", "STATE", "DRIVER", "AGE", "NEXT TRY", "LAST ERROR")
		for _, so := range p.Sockets {
			t.row(sanitize(so.Path), so.State, cellOr(sanitize(so.Driver), "-"), age(now, so.Since), until(now, so.NextRetry), o.text(so.LastError))
		}
		t.flush()
	}
	if len(p.Orphans) > 0 {
		fmt.Fprintln(w, "\nORPHANS (left on disk: the agent cannot clean or account for them)")
		t := newTable(w, "PATH", "AGE", "REASON")
		for _, or := range p.Orphans {
			t.row(sanitize(or.Path), age(now, or.Since), o.text(or.Reason))
		}
		t.flush()
	}
	if lv := p.LocalVolumes; lv != nil {
		fmt.Fprintln(w, "\nLOCAL VOLUMES")
		if lv.Error != "" {
			fmt.Fprintln(w, "error:", sanitize(lv.Error))
		}
		t := newTable(w, "PATH", "CLASS", "PV", "STATE", "AGE", "CLAIM", "CAPACITY", "REASON")
		for _, v := range lv.Volumes {
			t.row(sanitize(v.Path), sanitize(v.Class), cellOr(sanitize(v.PV), "-"), v.State, age(now, v.Since), cellOr(sanitize(v.Claim), "-"),
				cellOr(v.Capacity, "-"), o.text(strings.TrimSpace(v.Reason+" "+v.LastError)))
		}
		t.flush()
	}
	if len(p.InputErrors) > 0 {
		fmt.Fprintln(w, "\nINPUTS THE AGENT CANNOT USE")
		t := newTable(w, "INPUT", "ERROR")
		for _, e := range p.InputErrors {
			t.row(sanitize(e.Input), o.text(e.Error))
		}
		t.flush()
	}
	o.events(w, p.Events, now, 10)
	return nil
}

func (o options) podRow(t *table, pod model.Pod, v model.PodVolume, now time.Time) {
	reason := o.reason(v, now)
	if o.wide {
		t.row(pod.Namespace, pod.Name, string(pod.State), sanitize(v.Name), cellOr(sanitize(v.Source), "-"), string(v.State), age(now, v.Since),
			reason, cellOr(sanitize(v.MountPath), "-"))
		return
	}
	t.row(pod.Namespace, pod.Name, sanitize(v.Name), string(v.State), age(now, v.Since), reason)
}

// reason is why a volume is not ready, and when it is tried again.
func (o options) reason(v model.PodVolume, now time.Time) string {
	r := o.text(v.Reason)
	if v.RetryAt != nil {
		r += " (next try " + until(now, v.RetryAt) + ")"
	}
	return r
}

func (o options) operations(w io.Writer, ops []model.Operation, now time.Time) {
	if len(ops) == 0 {
		return
	}
	fmt.Fprintln(w, "\nOPERATIONS")
	t := newTable(w, "VOLUME", "POD", "OPERATION", "STATE", "AGE", "NEXT TRY", "LAST ERROR")
	for _, op := range ops {
		pod := "<every pod>"
		if op.Pod != nil {
			pod = op.Pod.String()
		}
		name := op.VolumeName
		if name == "" || o.wide {
			name = string(op.Volume)
		}
		t.row(sanitize(name), sanitize(pod), op.Operation, op.State, age(now, op.Since), until(now, op.RetryAt), o.text(op.LastError))
	}
	t.flush()
}

func (o options) events(w io.Writer, evs []events.Event, now time.Time, max int) {
	if len(evs) == 0 {
		return
	}
	if !o.wide && len(evs) > max {
		fmt.Fprintf(w, "\nEVENTS (the last %d of %d; --output wide shows all)\n", max, len(evs))
		evs = evs[:max]
	} else {
		fmt.Fprintln(w, "\nEVENTS")
	}
	t := newTable(w, "AGE", "TYPE", "OBJECT", "REASON", "MESSAGE")
	for _, e := range evs {
		obj := e.Object.Kind + " " + e.Object.Name
		if e.Object.Namespace != "" {
			obj = e.Object.Kind + " " + e.Object.Namespace + "/" + e.Object.Name
		}
		t.row(age(now, e.Time), e.Type, sanitize(obj), sanitize(e.Reason), o.text(e.Message))
	}
	t.flush()
}

// pod prints one pod's detail view.
func (o options) pod(w io.Writer, d *model.PodDetail) error {
	if o.json {
		return writeJSON(w, d)
	}
	now, p := d.Now, d.Pod
	fmt.Fprintf(w, "Pod %s (uid %s) on node %s: %s for %s\n", p.PodRef, p.UID, sanitize(d.Node), p.State, age(now, p.Since))
	if p.Reason != "" {
		fmt.Fprintf(w, "Reason: %s\n", sanitize(p.Reason))
	}
	fmt.Fprintln(w)
	if len(p.Volumes) == 0 {
		fmt.Fprintln(w, "No volumes.")
	} else {
		t := newTable(w, "VOLUME", "SOURCE", "STATE", "AGE", "REASON")
		for _, v := range p.Volumes {
			src := v.Source
			if v.Usage != nil {
				src += " · " + v.Usage.Text()
			}
			t.row(sanitize(v.Name), cellOr(sanitize(src), "-"), string(v.State), age(now, v.Since), o.reason(v, now))
		}
		t.flush()
	}
	if len(d.Mounts) > 0 {
		fmt.Fprintln(w, "\nMOUNTS (device or source → global mount → pod mounts)")
		for _, m := range d.Mounts {
			fmt.Fprintf(w, "%s (%s)\n", sanitize(m.Name), m.State)
			indent := "  "
			fmt.Fprintf(w, "%s%s\n", indent, sanitize(m.Origin))
			if m.GlobalMount != "" {
				fmt.Fprintf(w, "%s└─ %s\n", indent, sanitize(m.GlobalMount))
				indent += "   "
			}
			t := newTable(w)
			for i, pm := range m.Mounts {
				branch := "├─ "
				if i == len(m.Mounts)-1 {
					branch = "└─ "
				}
				who := pm.Pod.String()
				if pm.This {
					who += " (this pod)"
				}
				t.row(indent+branch+sanitize(who), pm.State, cellOr(sanitize(pm.Path), "-"))
			}
			t.flush()
		}
	}
	o.operations(w, d.Operations, now)
	if len(d.Timeline) > 0 {
		fmt.Fprintln(w, "\nTIMELINE (newest first)")
		t := newTable(w, "FINISHED", "AGE", "VOLUME", "OPERATION", "OUTCOME", "TOOK", "ERROR")
		for i := len(d.Timeline) - 1; i >= 0; i-- {
			e := d.Timeline[i]
			vol := sanitize(e.Name)
			if e.Pod.Name == "" {
				vol += " (every pod)"
			}
			t.row(e.End.Format("15:04:05.000"), age(now, e.End), vol, string(e.Op), string(e.Outcome),
				e.End.Sub(e.Start).Round(time.Millisecond).String(), cellOr(o.text(e.Error), "-"))
		}
		t.flush()
	}
	o.events(w, d.Events, now, 10)
	return nil
}
