// Command cdicheck checks CDI spec files the way a container runtime reads
// them: it loads a spec directory with the reference CDI library's cache,
// reports every spec error, resolves the requested devices and prints the
// edits they would make to a container. Tests use it as an independent judge
// of the CDI specs the driver writes.
//
// Usage: cdicheck --cdi-dir DIR [--device vendor/class=name ...]
//
// Output (stdout, JSON): {"specs": [paths], "devices": [qualified names],
// "edits": {"env": [...], "deviceNodes": [...], "mounts": [...], "hooks": {...}}}.
// Exit status 1, with the library's message on stderr, when a spec is invalid,
// the directory cannot be read, or a requested device cannot be resolved.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
)

// deviceList collects repeated --device flags.
type deviceList []string

func (d *deviceList) String() string { return strings.Join(*d, ",") }

func (d *deviceList) Set(value string) error {
	*d = append(*d, value)
	return nil
}

// edits is the part of the OCI spec that CDI container edits touch.
type edits struct {
	Env         []string          `json:"env"`
	DeviceNodes []oci.LinuxDevice `json:"deviceNodes"`
	Mounts      []oci.Mount       `json:"mounts"`
	Hooks       *oci.Hooks        `json:"hooks"`
}

type report struct {
	Specs   []string `json:"specs"`
	Devices []string `json:"devices"`
	Edits   edits    `json:"edits"`
}

func main() {
	var devices deviceList
	cdiDir := flag.String("cdi-dir", "", "directory of CDI spec files to check")
	flag.Var(&devices, "device", "fully-qualified CDI device to resolve (vendor/class=name); repeatable")
	flag.Parse()
	if *cdiDir == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: cdicheck --cdi-dir DIR [--device vendor/class=name ...]")
		os.Exit(2)
	}
	out, err := check(*cdiDir, devices)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cdicheck: %v\n", err)
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "cdicheck: %v\n", err)
		os.Exit(1)
	}
}

func check(dir string, devices []string) (*report, error) {
	for _, device := range devices {
		if _, _, _, err := parser.ParseQualifiedName(device); err != nil {
			return nil, fmt.Errorf("invalid device name %q: %w", device, err)
		}
	}
	// The directory must exist: the library treats a missing directory as
	// "no specs yet", which would let a wrong path pass as valid.
	if info, err := os.Stat(dir); err != nil {
		return nil, err
	} else if !info.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", dir)
	}
	// Manual refresh: one scan, no inotify watcher, deterministic results.
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, err
	}
	if err := specErrors(cache); err != nil {
		return nil, err
	}

	out := &report{Specs: []string{}, Devices: cache.ListDevices()}
	for _, vendor := range cache.ListVendors() {
		for _, spec := range cache.GetVendorSpecs(vendor) {
			out.Specs = append(out.Specs, spec.GetPath())
		}
	}
	sort.Strings(out.Specs)

	// Apply the edits to an empty container spec, as a runtime would to the
	// container's OCI spec.
	ociSpec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if len(devices) > 0 {
		if _, err := cache.InjectDevices(ociSpec, devices...); err != nil {
			return nil, err
		}
	}
	out.Edits = edits{
		Env:         nonNil(ociSpec.Process.Env),
		DeviceNodes: nonNil(ociSpec.Linux.Devices),
		Mounts:      nonNil(ociSpec.Mounts),
		Hooks:       ociSpec.Hooks,
	}
	if out.Edits.Hooks == nil {
		out.Edits.Hooks = &oci.Hooks{}
	}
	return out, nil
}

// specErrors joins the errors of every spec file and directory, in path
// order so the message is stable.
func specErrors(cache *cdi.Cache) error {
	byPath := cache.GetErrors()
	paths := make([]string, 0, len(byPath))
	for path := range byPath {
		paths = append(paths, path)
	}
	sort.Strings(paths)
	var all []error
	for _, path := range paths {
		for _, err := range byPath[path] {
			all = append(all, fmt.Errorf("%s: %w", path, err))
		}
	}
	return errors.Join(all...)
}

func nonNil[T any](items []T) []T {
	if items == nil {
		return []T{}
	}
	return items
}
