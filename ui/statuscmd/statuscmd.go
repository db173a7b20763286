// Package statuscmd is `volume-agent status`: the operator page in a
// terminal. It reads the agent's debug endpoint (ui/client) and prints
// aligned columns the way `kubectl get` does; --pod shows one pod with its
// mount tree and operation timeline, --watch prints again after every
// change the agent streams.
package statuscmd

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/volume-agent/volume-agent/ui/client"
	"github.com/volume-agent/volume-agent/ui/model"
)

// Main runs the command with args (after "status").
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("volume-agent status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	address := fs.String("address", "127.0.0.1:9808", "the agent's --debug-address (host:port or URL)")
	pod := fs.String("pod", "", "show one pod, NAMESPACE/NAME: its volumes, mount tree and operation timeline")
	namespace := fs.String("namespace", "", "only pods of this namespace")
	state := fs.String("state", "", "only pods with a volume in this state ("+stateList()+") or in this pod state (ready, waiting, error, terminating)")
	watch := fs.Bool("watch", false, "print again after every change, until interrupted")
	output := fs.String("output", "", "wide: more columns (volume sources, whole errors); json: the model as JSON")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: volume-agent status [--pod NAMESPACE/NAME] [--namespace NS] [--state STATE] [--watch] [--output wide|json] [--address HOST:PORT]")
		fmt.Fprintln(stderr, "Shows the pods on the agent's node with their volumes, operations, CSI drivers, orphans and events.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (see --help)", fs.Args())
	}
	o := options{wide: *output == "wide", json: *output == "json"}
	if *output != "" && !o.wide && !o.json {
		return fmt.Errorf("--output %q: want wide or json", *output)
	}
	c := client.New(*address)
	if *pod != "" {
		ns, name, ok := strings.Cut(*pod, "/")
		if !ok || ns == "" || name == "" {
			return fmt.Errorf("--pod %q: want NAMESPACE/NAME", *pod)
		}
		if *namespace != "" || *state != "" {
			return errors.New("--pod shows one pod: --namespace and --state do not apply")
		}
		if !*watch {
			d, err := c.Pod(ctx, ns, name)
			if err != nil {
				return err
			}
			return o.pod(stdout, d)
		}
		w := newWatcher(stdout, stderr, *address, o.json)
		return w.run(ctx, func(ctx context.Context) error {
			return c.WatchPod(ctx, ns, name, func(d *model.PodDetail, err error) error {
				return w.show(func(out io.Writer) error {
					if err != nil {
						_, werr := fmt.Fprintln(out, sanitize(err.Error()))
						return werr
					}
					return o.pod(out, d)
				})
			})
		})
	}
	f := model.Filter{Namespace: *namespace, State: *state}
	if !*watch {
		p, err := c.Page(ctx, f)
		if err != nil {
			return err
		}
		return o.page(stdout, p)
	}
	w := newWatcher(stdout, stderr, *address, o.json)
	return w.run(ctx, func(ctx context.Context) error {
		return c.WatchPage(ctx, f, func(p *model.Page) error {
			return w.show(func(out io.Writer) error { return o.page(out, p) })
		})
	})
}

func stateList() string {
	var s []string
	for _, st := range model.States {
		s = append(s, string(st))
	}
	return strings.Join(append(s, model.NotReady), ", ")
}

// now is the clock of the watch headers (a test's is fixed).
var now = time.Now

// watcher prints each new rendering: on a terminal over the last one, in a
// pipe one after the other.
type watcher struct {
	out, errOut io.Writer
	address     string
	terminal    bool
	json        bool
}

func newWatcher(out, errOut io.Writer, address string, json bool) *watcher {
	return &watcher{out: out, errOut: errOut, address: address, terminal: !json && isTerminal(out), json: json}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// show renders into a buffer first, so a screen is replaced at once.
func (w *watcher) show(render func(io.Writer) error) error {
	var buf bytes.Buffer
	switch {
	case w.terminal:
		buf.WriteString("\x1b[H\x1b[2J")
		fmt.Fprintf(&buf, "volume-agent status --watch (%s), %s; Ctrl-C to stop\n\n", w.address, now().Format("15:04:05"))
	case !w.json:
		fmt.Fprintf(&buf, "--- %s\n", now().Format(time.RFC3339))
	}
	if err := render(&buf); err != nil {
		return err
	}
	_, err := w.out.Write(buf.Bytes())
	return err
}

// run watches until ctx ends, reconnecting (every 2 s) when the stream is
// lost: the agent restarted, or was not up yet.
func (w *watcher) run(ctx context.Context, watch func(context.Context) error) error {
	var lastErr string
	for {
		err := watch(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var nf *client.NotFoundError
		if errors.As(err, &nf) {
			return err
		}
		if msg := err.Error(); msg != lastErr {
			fmt.Fprintf(w.errOut, "%s; retrying every 2s\n", msg)
			lastErr = msg
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(2 * time.Second):
		}
	}
}
