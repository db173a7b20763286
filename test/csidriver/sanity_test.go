package csidriver

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
)

var sanityRan bool

// TestSanity runs the csi-test sanity suite against the driver in several
// configurations at once (Ginkgo allows one RunSpecs per process, so every
// configuration is a top-level container of the same suite).
func TestSanity(t *testing.T) {
	requireLoopDevices(t)
	if sanityRan {
		t.Skip("skipping: Ginkgo runs its specs only once per process (-count > 1?)")
	}
	sanityRan = true
	base := newTestDir(t)

	type suite struct {
		name   string
		driver Config
		tune   func(*sanity.TestConfig)
	}
	suites := []suite{
		{
			// Everything on: attach, staging, topology, a volume limit
			// and the volume condition of CSI 1.12 drivers.
			name:   "attach-stage-mount",
			driver: Config{AttachRequired: true, Topology: true, MaxVolumesPerNode: 4, VolumeCondition: true},
			tune:   func(c *sanity.TestConfig) { c.TestNodeVolumeAttachLimit = true },
		},
		{
			name:   "publish-only-mount",
			driver: Config{DisableStaging: true},
		},
		{
			name:   "attach-stage-block",
			driver: Config{AttachRequired: true},
			tune:   func(c *sanity.TestConfig) { c.TestVolumeAccessType = "block" },
		},
		{
			name:   "publish-only-block",
			driver: Config{DisableStaging: true},
			tune:   func(c *sanity.TestConfig) { c.TestVolumeAccessType = "block" },
		},
	}
	if haveXFS() {
		suites = append(suites, suite{
			// mkfs.xfs wants at least 300 MiB; the files are sparse.
			name:   "stage-xfs",
			driver: Config{DefaultFSType: "xfs"},
			tune: func(c *sanity.TestConfig) {
				c.TestVolumeSize = 320 << 20
				c.TestVolumeExpandSize = 400 << 20
			},
		})
	} else {
		t.Log("mkfs.xfs/xfs_growfs not installed: no xfs run")
	}

	var drivers []*Driver
	var contexts []*sanity.TestContext
	for _, s := range suites {
		dir := filepath.Join(base, s.name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		d, _ := startDriver(t, dir, s.driver)
		drivers = append(drivers, d)

		cfg := sanity.NewTestConfig()
		cfg.Address = d.Endpoint()
		cfg.TargetPath = filepath.Join(dir, "target")
		cfg.StagingPath = filepath.Join(dir, "staging")
		cfg.TestVolumeSize = 64 << 20
		cfg.TestVolumeExpandSize = 128 << 20
		if s.tune != nil {
			s.tune(&cfg)
		}
		ginkgo.Describe(s.name, func() {
			contexts = append(contexts, sanity.GinkgoTest(&cfg))
		})
	}

	gomega.RegisterFailHandler(ginkgo.Fail)
	suiteCfg, reporterCfg := ginkgo.GinkgoConfiguration()
	reporterCfg.Succinct = !testing.Verbose()
	ginkgo.RunSpecs(t, "CSI driver sanity", suiteCfg, reporterCfg)
	for _, sc := range contexts {
		sc.Finalize()
	}

	// Sanity deletes what it creates; nothing may be left behind.
	for i, d := range drivers {
		if vols := d.Volumes(); len(vols) > 0 {
			t.Errorf("%s: volumes left: %+v", suites[i].name, vols)
		}
	}
	expectClean(t, base)
}
