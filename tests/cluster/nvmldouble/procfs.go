package main

// What the NVIDIA kernel driver shows under /proc, written under the configured procRoot so the
// plugin (and nvidia-ctk) find MIG capability device minors the way they do on a real node.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The nvidia-caps minors, as the driver lays them out in /proc/driver/nvidia-caps/mig-minors
// (MIG user guide, "Device Nodes and Capabilities"): "config 1", "monitor 2", then for every GPU
// 0..31 its GPU instances 0..14, each an access minor followed by its compute instances 0..7.
const (
	capsMaxGPUs   = 32
	capsGIsPerGPU = 15
	capsCIsPerGI  = 8
	capsPerGI     = 1 + capsCIsPerGI
	capsPerGPU    = capsGIsPerGPU * capsPerGI
)

func giMinor(gpuMinor int, gi uint32) int {
	return 3 + gpuMinor*capsPerGPU + int(gi)*capsPerGI
}

func ciMinor(gpuMinor int, gi, ci uint32) int { return giMinor(gpuMinor, gi) + 1 + int(ci) }

// accessFile is the content of a capability's "access" file as nvidia-caps writes it.
func accessFile(minor int) string {
	return fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 292\nDeviceFileModify: 1\n", minor)
}

func writeIfChanged(path, content string) error {
	if old, err := os.ReadFile(path); err == nil && string(old) == content {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o444); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// syncProc makes <procRoot> match the configuration and the shared state.
func syncProc(l *loaded, s *State) error {
	root := l.cfg.ProcRoot
	if root == "" {
		return nil
	}
	// /proc/devices: 195 is the NVIDIA character major (nvidia-frontend); nvidia-uvm and
	// nvidia-caps get dynamic majors, shown here with values a real node commonly has.
	devices := "Character devices:\n  1 mem\n  4 /dev/vc/0\n  4 tty\n  5 /dev/tty\n  5 /dev/console\n" +
		"  5 /dev/ptmx\n 10 misc\n 13 input\n 29 fb\n136 pts\n195 nvidia-frontend\n234 nvidia-uvm\n" +
		"235 nvidia-caps\n\nBlock devices:\n  7 loop\n  8 sd\n259 blkext\n"
	// /proc/driver/nvidia/version, the NVRM line as the proprietary kernel module prints it.
	version := fmt.Sprintf("NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  Thu Apr  3 17:35:12 UTC 2025\n"+
		"GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n", l.cfg.DriverVersion)
	var minors strings.Builder
	minors.WriteString("config 1\nmonitor 2\n")
	for g := 0; g < capsMaxGPUs; g++ {
		for gi := uint32(0); gi < capsGIsPerGPU; gi++ {
			fmt.Fprintf(&minors, "gpu%d/gi%d/access %d\n", g, gi, giMinor(g, gi))
			for ci := uint32(0); ci < capsCIsPerGI; ci++ {
				fmt.Fprintf(&minors, "gpu%d/gi%d/ci%d/access %d\n", g, gi, ci, ciMinor(g, gi, ci))
			}
		}
	}
	caps := filepath.Join(root, "driver", "nvidia", "capabilities")
	files := map[string]string{
		filepath.Join(root, "devices"):                             devices,
		filepath.Join(root, "driver", "nvidia", "version"):         version,
		filepath.Join(root, "driver", "nvidia-caps", "mig-minors"): minors.String(),
		filepath.Join(caps, "mig", "config"):                       accessFile(1),
		filepath.Join(caps, "mig", "monitor"):                      accessFile(2),
	}
	for path, content := range files {
		if err := writeIfChanged(path, content); err != nil {
			return err
		}
	}
	for _, g := range l.all {
		mig := filepath.Join(caps, fmt.Sprintf("gpu%d", g.minor), "mig")
		want := map[string]string{}
		if st := s.GPUs[g.uuid]; st != nil {
			for _, gi := range st.GpuInstances {
				want[filepath.Join(mig, fmt.Sprintf("gi%d", gi.ID), "access")] = accessFile(giMinor(g.minor, gi.ID))
				for _, ci := range gi.ComputeInstances {
					want[filepath.Join(mig, fmt.Sprintf("gi%d", gi.ID), fmt.Sprintf("ci%d", ci.ID), "access")] =
						accessFile(ciMinor(g.minor, gi.ID, ci.ID))
				}
			}
		}
		// Remove what no instance backs any more (a destroyed GI or CI), then write what is wanted.
		_ = filepath.Walk(mig, func(path string, info os.FileInfo, err error) error {
			if err == nil && !info.IsDir() {
				if _, ok := want[path]; !ok {
					os.Remove(path)
				}
			}
			return nil
		})
		removeEmptyDirs(mig)
		for path, content := range want {
			if err := writeIfChanged(path, content); err != nil {
				return err
			}
		}
	}
	return nil
}

func removeEmptyDirs(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.IsDir() {
			sub := filepath.Join(dir, e.Name())
			removeEmptyDirs(sub)
			os.Remove(sub) // fails, harmlessly, when not empty
		}
	}
}
