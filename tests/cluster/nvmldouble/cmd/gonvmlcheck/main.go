// gonvmlcheck loads an NVML library the way nvidia-ctk does (go-nvml, dlopen through
// nvml.WithLibraryPath) and prints, as JSON, what nvidia-ctk's "cdi generate" reads: count,
// handles, UUID, minor, PCI bus id, MIG mode, MIG devices with their parent, GI/CI ids and
// attributes, name, brand, CUDA compute capability and the driver version. A Go program loading
// the double is a Go runtime loading a second Go runtime: this is the check that it works.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

type mig struct {
	UUID       string `json:"uuid"`
	ParentUUID string `json:"parentUuid"`
	GI         int    `json:"gi"`
	CI         int    `json:"ci"`
	Name       string `json:"name"`
	MemoryMB   uint64 `json:"memoryMB"`
}

type device struct {
	UUID    string `json:"uuid"`
	Name    string `json:"name"`
	Minor   int    `json:"minor"`
	BusID   string `json:"busId"`
	Brand   int    `json:"brand"`
	CC      string `json:"cudaComputeCapability"`
	MigMode int    `json:"migMode"`
	Migs    []mig  `json:"migDevices"`
}

func check(what string, r nvml.Return) {
	if r != nvml.SUCCESS {
		fmt.Fprintf(os.Stderr, "gonvmlcheck: %s: %v\n", what, r)
		os.Exit(1)
	}
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gonvmlcheck <libnvidia-ml.so.1>")
		os.Exit(2)
	}
	lib := nvml.New(nvml.WithLibraryPath(os.Args[1]))
	check("Init", lib.Init())
	defer lib.Shutdown()
	driver, r := lib.SystemGetDriverVersion()
	check("SystemGetDriverVersion", r)
	n, r := lib.DeviceGetCount()
	check("DeviceGetCount", r)
	out := struct {
		Driver  string   `json:"driverVersion"`
		Devices []device `json:"devices"`
	}{Driver: driver}
	for i := 0; i < n; i++ {
		d, r := lib.DeviceGetHandleByIndex(i)
		check("DeviceGetHandleByIndex", r)
		var dev device
		dev.UUID, r = d.GetUUID()
		check("GetUUID", r)
		dev.Name, r = d.GetName()
		check("GetName", r)
		dev.Minor, r = d.GetMinorNumber()
		check("GetMinorNumber", r)
		pci, r := d.GetPciInfo()
		check("GetPciInfo", r)
		dev.BusID = string(bytesUntilNul(pci.BusId[:]))
		brand, r := d.GetBrand()
		check("GetBrand", r)
		dev.Brand = int(brand)
		major, minor, r := d.GetCudaComputeCapability()
		check("GetCudaComputeCapability", r)
		dev.CC = fmt.Sprintf("%d.%d", major, minor)
		cur, _, r := d.GetMigMode()
		check("GetMigMode", r)
		dev.MigMode = cur
		if cur == nvml.DEVICE_MIG_ENABLE {
			max, r := d.GetMaxMigDeviceCount()
			check("GetMaxMigDeviceCount", r)
			for k := 0; k < max; k++ {
				m, r := d.GetMigDeviceHandleByIndex(k)
				if r == nvml.ERROR_NOT_FOUND {
					continue
				}
				check("GetMigDeviceHandleByIndex", r)
				var md mig
				md.UUID, r = m.GetUUID()
				check("mig GetUUID", r)
				parent, r := m.GetDeviceHandleFromMigDeviceHandle()
				check("GetDeviceHandleFromMigDeviceHandle", r)
				md.ParentUUID, r = parent.GetUUID()
				check("parent GetUUID", r)
				md.GI, r = m.GetGpuInstanceId()
				check("GetGpuInstanceId", r)
				md.CI, r = m.GetComputeInstanceId()
				check("GetComputeInstanceId", r)
				md.Name, r = m.GetName()
				check("mig GetName", r)
				attrs, r := m.GetAttributes()
				check("GetAttributes", r)
				md.MemoryMB = attrs.MemorySizeMB
				dev.Migs = append(dev.Migs, md)
			}
		}
		out.Devices = append(out.Devices, dev)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
}

func bytesUntilNul[T ~int8 | ~uint8](s []T) []byte {
	b := make([]byte, 0, len(s))
	for _, c := range s {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return b
}
