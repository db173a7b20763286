// Command test-csi-driver runs volume-agent's test CSI driver (package
// test/csidriver) as a process, for tests that need a driver they can kill,
// restart or watch register itself.
//
// Call counts are written to <state-dir>/calls.json after every call. Faults
// can be set with flags at start and changed later through --control-socket.
// SIGTERM or SIGINT stops the driver cleanly: sockets are removed, volumes
// stay staged and published for the next run on the same state directory.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/volume-agent/volume-agent/test/csidriver"
)

// listFlag collects a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "test-csi-driver:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		cfg                                 csidriver.Config
		faults, hangs                       listFlag
		capacity, volumeSize, ephemeralSize string
		logLevel                            = zapcore.InfoLevel
		fs                                  = flag.CommandLine
	)
	fs.StringVar(&cfg.Endpoint, "endpoint", "unix:///tmp/test-csi-driver/csi.sock", "CSI endpoint, unix:///path/to/csi.sock")
	fs.StringVar(&cfg.Name, "name", csidriver.DefaultName, "CSI driver name")
	fs.StringVar(&cfg.Version, "vendor-version", "1.0.0", "vendor version reported by GetPluginInfo")
	fs.StringVar(&cfg.NodeID, "node-id", "", "node ID (default: the host name)")
	fs.StringVar(&cfg.StateDir, "state-dir", "/var/lib/test-csi-driver", "directory for backing files, state.json and calls.json")
	fs.StringVar(&cfg.RegistrationDir, "registration-dir", "", "serve the kubelet plugin registration API at DIR/<name>-reg.sock")
	fs.StringVar(&cfg.ControlSocket, "control-socket", "", "serve the HTTP control API (faults, call counts) on this unix socket")
	fs.BoolVar(&cfg.AttachRequired, "attach-required", false, "enable ControllerPublishVolume/ControllerUnpublishVolume and require them before staging")
	fs.BoolVar(&cfg.DisableStaging, "disable-staging", false, "drop STAGE_UNSTAGE_VOLUME: NodePublishVolume does all the node work")
	fs.BoolVar(&cfg.DisableSingleNodeMultiWriter, "disable-single-node-multi-writer", false,
		"drop SINGLE_NODE_MULTI_WRITER (node and controller) and refuse the SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER access modes")
	fs.BoolVar(&cfg.Topology, "topology", false, "advertise VOLUME_ACCESSIBILITY_CONSTRAINTS with "+csidriver.TopologyKey("<name>")+"=<node-id>")
	fs.BoolVar(&cfg.VolumeCondition, "volume-condition", false, "advertise VOLUME_CONDITION (value 4, removed in CSI 1.13) and report volume_condition in NodeGetVolumeStats, as a driver built with CSI 1.12 does (see the control API's /conditions)")
	fs.Int64Var(&cfg.MaxVolumesPerNode, "max-volumes-per-node", 0, "max_volumes_per_node reported by NodeGetInfo and enforced by ControllerPublishVolume (0: no limit)")
	fs.StringVar(&capacity, "capacity", "", "total size of all volumes, e.g. 10Gi (default: free space of --state-dir)")
	fs.StringVar(&volumeSize, "default-volume-size", "64Mi", "size of volumes created without a capacity range")
	fs.StringVar(&ephemeralSize, "ephemeral-volume-size", "16Mi", "size of inline ephemeral volumes without a \"size\" in their volume context")
	fs.StringVar(&cfg.DefaultFSType, "default-fstype", csidriver.DefaultFSType, "filesystem created when the volume capability names none (ext2, ext3, ext4, xfs)")
	fs.Var(&faults, "fault", "METHOD=CODE[:N]: make a gRPC method fail with CODE for the next N calls (default: always); repeatable")
	fs.Var(&hangs, "hang", "METHOD: block calls of the method until their context ends; repeatable")
	fs.IntVar(&cfg.CrashAfter, "crash-after", 0, "exit with status 2 once this many CSI calls have been answered (0: never)")
	fs.Var(&logLevel, "log-level", "log level: debug, info, warn, error (default info)")
	flag.Parse()
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}

	var err error
	if cfg.Capacity, err = csidriver.ParseSize(capacity, 0); err != nil {
		return fmt.Errorf("--capacity: %w", err)
	}
	if cfg.DefaultVolumeSize, err = csidriver.ParseSize(volumeSize, 0); err != nil {
		return fmt.Errorf("--default-volume-size: %w", err)
	}
	if cfg.DefaultEphemeralVolumeSize, err = csidriver.ParseSize(ephemeralSize, 0); err != nil {
		return fmt.Errorf("--ephemeral-volume-size: %w", err)
	}
	for _, s := range faults {
		f, err := csidriver.ParseFault(s)
		if err != nil {
			return fmt.Errorf("--fault: %w", err)
		}
		cfg.Faults = append(cfg.Faults, f)
	}
	cfg.Hangs = hangs
	cfg.CallsFile = filepath.Join(cfg.StateDir, "calls.json")

	logCfg := zap.NewDevelopmentConfig()
	logCfg.Level = zap.NewAtomicLevelAt(logLevel)
	logCfg.EncoderConfig.EncodeLevel = zapcore.CapitalLevelEncoder
	logCfg.DisableStacktrace = true
	log, err := logCfg.Build()
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // nothing to do about a failed flush of stderr
	cfg.Logger = log

	d, err := csidriver.New(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return d.Run(ctx)
}
