package main

// The double's configuration: a JSON file named by NVML_DOUBLE_CONFIG (see README.md).

/*
#include <stdlib.h>
*/
import "C"

import (
	"bytes"
	"crypto/sha1"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

type Config struct {
	Name              string      `json:"name"`
	Machine           string      `json:"machine"`
	Models            []string    `json:"models"`
	GPUCount          *int        `json:"gpuCount"`
	DriverVersion     string      `json:"driverVersion"`
	CudaDriverVersion int         `json:"cudaDriverVersion"`
	NvmlVersion       string      `json:"nvmlVersion"`
	GPUs              []GPUConfig `json:"gpus"`
	StateFile         string      `json:"stateFile"`
	ProcRoot          string      `json:"procRoot"`
	DevRoot           string      `json:"devRoot"`
	EventsFile        string      `json:"eventsFile"`
	ResetAtInit       bool        `json:"resetAtInit"`
}

type GPUConfig struct {
	Index              int         `json:"index"`
	UUID               string      `json:"uuid"`
	PciBusID           string      `json:"pciBusId"`
	Minor              *int        `json:"minor"`
	MigMode            *int        `json:"migMode"`
	MigModePending     *int        `json:"migModePending"`
	Lost               bool        `json:"lost"`
	UnifiedMemory      bool        `json:"unifiedMemory"`
	MemoryLimits       *bool       `json:"memoryLimits"`
	Brand              *int        `json:"brand"`
	MigDevices         []MigDevice `json:"migDevices"`
	Processes          []Process   `json:"processes"`
	GpuUtilization     uint32      `json:"gpuUtilization"`
	MemoryUtilization  uint32      `json:"memoryUtilization"`
	PowerMilliwatts    *uint32     `json:"powerMilliwatts"`
	TemperatureCelsius *uint32     `json:"temperatureCelsius"`
	EccCorrected       uint64      `json:"eccCorrected"`
	EccUncorrected     uint64      `json:"eccUncorrected"`
	ThrottleReasons    uint64      `json:"throttleReasons"`
}

type MigDevice struct {
	GiProfileID      int        `json:"giProfileId"`
	Start            int        `json:"start"`
	ComputeInstances []CIConfig `json:"computeInstances"`
}

type CIConfig struct {
	CiProfileID int  `json:"ciProfileId"`
	Start       *int `json:"start"`
}

type Process struct {
	Pid               uint32  `json:"pid"`
	UsedMemory        uint64  `json:"usedMemory"`
	GpuInstanceID     *uint32 `json:"gpuInstanceId"`
	ComputeInstanceID *uint32 `json:"computeInstanceId"`
	Mps               bool    `json:"mps"`
	SmUtil            uint32  `json:"smUtil"`
	MemUtil           uint32  `json:"memUtil"`
}

// gpu is one configured GPU: NVIDIA's mock device (its static model data) plus the overrides.
type gpu struct {
	cfgIndex int
	index    int // NVML index among the visible GPUs
	mock     *server.Device
	model    gpus.Config
	uuid     string
	busID    string // NVML_DEVICE_PCI_BUS_ID_FMT "%08X:%02X:%02X.0"
	domain   uint32
	bus      uint32
	minor    int
	o        GPUConfig
}

type loaded struct {
	cfg     Config
	path    string
	mtimeNs int64
	size    int64
	all     []*gpu // by configured index
	visible []*gpu // by NVML index
}

var models = map[string]gpus.Config{
	"A100_SXM4_40GB":  gpus.A100_SXM4_40GB,
	"A100_SXM4_80GB":  gpus.A100_SXM4_80GB,
	"A100_PCIE_40GB":  gpus.A100_PCIE_40GB,
	"A100_PCIE_80GB":  gpus.A100_PCIE_80GB,
	"A30_PCIE_24GB":   gpus.A30_PCIE_24GB,
	"H100_SXM5_80GB":  gpus.H100_SXM5_80GB,
	"H200_SXM5_141GB": gpus.H200_SXM5_141GB,
	"B200_SXM5_180GB": gpus.B200_SXM5_180GB,
}

// machines builds the mock's DGX servers; their GPU model comes from NVIDIA's dgx* packages.
var machines = map[string]func(n int) *server.Server{
	"dgxa100": func(n int) *server.Server { return dgxa100.NewWithGPUs(gpus.Multiple(n, gpus.A100_SXM4_40GB)...) },
	"dgxh100": func(n int) *server.Server { return dgxh100.NewWithGPUs(gpus.Multiple(n, gpus.H100_SXM5_80GB)...) },
	"dgxh200": func(n int) *server.Server { return dgxh200.NewWithGPUs(gpus.Multiple(n, gpus.H200_SXM5_141GB)...) },
	"dgxb200": func(n int) *server.Server { return dgxb200.NewWithGPUs(gpus.Multiple(n, gpus.B200_SXM5_180GB)...) },
}

const (
	defaultDriver = "550.163.01"
	defaultCuda   = 12040 // R550 drivers report CUDA 12.4
)

func loadConfig() (*loaded, error) {
	// getenv(3), not os.Getenv: Go copies the environment when the library is loaded, and a process
	// (a test's own pynvml) may name another configuration before each nvmlInit.
	name := C.CString("NVML_DOUBLE_CONFIG")
	defer C.free(unsafe.Pointer(name))
	path := ""
	if v := C.getenv(name); v != nil {
		path = C.GoString(v)
	}
	l := &loaded{path: path}
	if path == "" {
		// Built in: one H100 80GB SXM, MIG off, so nvidia-smi runs anywhere.
		one := 1
		l.cfg = Config{Machine: "dgxh100", GPUCount: &one}
		l.cfg.StateFile = filepath.Join(os.TempDir(), "nvml-double-default.state")
	} else {
		st, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		l.mtimeNs, l.size = st.ModTime().UnixNano(), st.Size()
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields() // a misspelt field must not be silently ignored
		if err := dec.Decode(&l.cfg); err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		if l.cfg.StateFile == "" {
			l.cfg.StateFile = path + ".state"
		}
	}
	if err := l.build(); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return l, nil
}

func (l *loaded) build() error {
	c := &l.cfg
	if c.DriverVersion == "" {
		c.DriverVersion = defaultDriver
	}
	if c.CudaDriverVersion == 0 {
		c.CudaDriverVersion = defaultCuda
	}
	if c.NvmlVersion == "" {
		// NVML's version is the CUDA major, then the driver version: "12.550.163.01".
		c.NvmlVersion = fmt.Sprintf("%d.%s", c.CudaDriverVersion/1000, c.DriverVersion)
	}
	var srv *server.Server
	switch {
	case c.Machine != "" && len(c.Models) > 0:
		return fmt.Errorf(`"machine" and "models" exclude each other`)
	case len(c.Models) > 0:
		cfgs := make([]gpus.Config, 0, len(c.Models))
		for _, m := range c.Models {
			g, ok := models[m]
			if !ok {
				return fmt.Errorf("unknown GPU model %q (known: %s)", m, keys(models))
			}
			cfgs = append(cfgs, g)
		}
		if c.GPUCount != nil && *c.GPUCount != len(cfgs) {
			return fmt.Errorf("gpuCount %d but %d models", *c.GPUCount, len(cfgs))
		}
		srv = server.NewServerWithGPUs(c.DriverVersion, c.NvmlVersion, c.CudaDriverVersion, cfgs...)
	default:
		if c.Machine == "" {
			c.Machine = "dgxh100"
		}
		mk, ok := machines[c.Machine]
		if !ok {
			return fmt.Errorf("unknown machine %q (known: dgxa100, dgxh100, dgxh200, dgxb200)", c.Machine)
		}
		n := 8 // the DGX systems of the mock have 8 GPUs
		if c.GPUCount != nil {
			n = *c.GPUCount
		}
		if n < 0 || n > 32 {
			return fmt.Errorf("gpuCount %d out of range 0..32", n)
		}
		srv = mk(n)
	}
	if c.Name == "" {
		c.Name = c.Machine
		if c.Name == "" {
			c.Name = strings.Join(c.Models, ",")
		}
	}
	overrides := map[int]GPUConfig{}
	for _, o := range c.GPUs {
		if o.Index < 0 || o.Index >= len(srv.Devices) {
			return fmt.Errorf("gpus: index %d out of range (%d GPUs)", o.Index, len(srv.Devices))
		}
		if _, dup := overrides[o.Index]; dup {
			return fmt.Errorf("gpus: index %d given twice", o.Index)
		}
		overrides[o.Index] = o
	}
	for i, d := range srv.Devices {
		md := d.(*server.Device)
		g := &gpu{cfgIndex: i, mock: md, model: md.Config, minor: md.Minor, o: overrides[i]}
		// The mock draws random UUIDs; processes sharing one machine must agree, so derive them.
		g.uuid = "GPU-" + nameUUID(fmt.Sprintf("%s/gpu/%d", c.Name, i))
		if g.o.UUID != "" {
			g.uuid = g.o.UUID
		}
		md.UUID = g.uuid
		if g.o.Minor != nil {
			g.minor = *g.o.Minor
		}
		// The mock numbers buses by index ("0000:%02x:00.0").
		g.bus = uint32(i)
		if g.o.PciBusID != "" {
			var dev uint32
			if _, err := fmt.Sscanf(g.o.PciBusID, "%x:%x:%x.", &g.domain, &g.bus, &dev); err != nil {
				return fmt.Errorf("gpus[%d].pciBusId %q: want DOMAIN:BUS:DEVICE.FUNCTION", i, g.o.PciBusID)
			}
		}
		g.busID = fmt.Sprintf("%08X:%02X:00.0", g.domain, g.bus)
		if err := checkMigDevices(g); err != nil {
			return fmt.Errorf("gpus[%d]: %v", i, err)
		}
		l.all = append(l.all, g)
	}
	for _, g := range l.all {
		if c.DevRoot != "" {
			// In a container NVML sees only the GPUs whose device node it can open.
			if _, err := os.Stat(filepath.Join(c.DevRoot, fmt.Sprintf("nvidia%d", g.minor))); err != nil {
				continue
			}
		}
		g.index = len(l.visible)
		l.visible = append(l.visible, g)
	}
	return nil
}

func checkMigDevices(g *gpu) error {
	for k, m := range g.o.MigDevices {
		p, ok := g.model.MIGProfiles.GpuInstanceProfiles[m.GiProfileID]
		if !ok {
			return fmt.Errorf("migDevices[%d]: GPU instance profile %d unknown to %s", k, m.GiProfileID, g.model.Name)
		}
		if _, ok := placementOf(g, m.GiProfileID, uint32(m.Start)); !ok {
			return fmt.Errorf("migDevices[%d]: %s cannot start at slice %d", k, profileName(int(p.Id), p), m.Start)
		}
		for j, ci := range m.ComputeInstances {
			if _, ok := g.model.MIGProfiles.ComputeInstanceProfiles[m.GiProfileID][ci.CiProfileID]; !ok {
				return fmt.Errorf("migDevices[%d].computeInstances[%d]: compute instance profile %d unknown", k, j, ci.CiProfileID)
			}
		}
	}
	return nil
}

func placementOf(g *gpu, profileID int, start uint32) (nvml.GpuInstancePlacement, bool) {
	for _, p := range g.model.MIGProfiles.GpuInstancePlacements[profileID] {
		if p.Start == start {
			return p, true
		}
	}
	return nvml.GpuInstancePlacement{}, false
}

// nameUUID is an RFC 4122 version-5 style UUID (SHA-1 of a name), so every process derives the same one.
func nameUUID(name string) string {
	h := sha1.Sum([]byte("nvml-double/" + name))
	h[6] = (h[6] & 0x0f) | 0x50
	h[8] = (h[8] & 0x3f) | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// profileName is NVIDIA's MIG profile naming: "<GPU slices>g.<memory GB>gb", with suffixes for the
// media-engine variants (MIG user guide, "Supported MIG Profiles").
func profileName(id int, p nvml.GpuInstanceProfileInfo) string {
	name := fmt.Sprintf("%dg.%dgb", p.SliceCount, (p.MemorySizeMB+1023)/1024)
	switch id {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:
		name += "+me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME:
		name += "+me.all"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:
		name += "-me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX,
		nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX:
		name += "+gfx"
	}
	return name
}

func keys[V any](m map[string]V) string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return strings.Join(sortStrings(out), ", ")
}

func sortStrings(s []string) []string {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s
}
