// metadatacheck: upstream's side of the device metadata contract (KEP-5304), for
// tests/integration/test_device_metadata_upstream.py and tests/e2e.
//
// Two modes, each printing one JSON document on stdout:
//
//	metadatacheck decode DIR
//	    Every metadata.json under DIR is decoded with upstream's reader,
//	    devicemetadata.DecodeMetadataFromStream, into the internal type with
//	    validation on (what an in-container consumer built on
//	    k8s.io/dynamic-resource-allocation does), and every
//	    *_metadata_*.json CDI spec under DIR is parsed with the CDI project's
//	    own spec types and its minimum version checked. Output: {"files": [...]}
//	    with one verdict per file ("ok", "error", what was decoded).
//
//	metadatacheck write JOB OUTDIR
//	    Drives upstream's kubelet plugin helper (kubeletplugin.Start with
//	    EnableDeviceMetadata) through its Go API: a fake clientset holds the
//	    job's ResourceClaim, a DRAPlugin returns the job's devices, and the
//	    harness calls NodePrepareResources (then, with "unprepare": true,
//	    NodeUnprepareResources) on the helper's own gRPC socket, as the kubelet
//	    does. The helper writes its metadata files under OUTDIR/plugin and its CDI
//	    specs under OUTDIR/cdi. Output: the gRPC answers and the files left after
//	    each call.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

func main() {
	if len(os.Args) < 3 {
		fail("usage: metadatacheck decode DIR | metadatacheck write JOB OUTDIR")
	}
	switch os.Args[1] {
	case "decode":
		write(map[string]any{"files": decodeDir(os.Args[2])})
	case "write":
		if len(os.Args) != 4 {
			fail("usage: metadatacheck write JOB OUTDIR")
		}
		write(runHelper(os.Args[2], os.Args[3]))
	default:
		fail("unknown mode %q", os.Args[1])
	}
}

// --- decode ---------------------------------------------------------------------------------------

type verdict struct {
	Path       string                          `json:"path"`
	Kind       string                          `json:"kind"` // "metadata" or "cdi"
	Mode       string                          `json:"mode"`
	OK         bool                            `json:"ok"`
	Error      string                          `json:"error,omitempty"`
	GVK        string                          `json:"gvk,omitempty"`
	Decoded    *metadatav1beta1.DeviceMetadata `json:"decoded,omitempty"`
	CDIKind    string                          `json:"cdiKind,omitempty"`
	CDIVersion string                          `json:"cdiVersion,omitempty"`
	MinVersion string                          `json:"minVersion,omitempty"`
	Devices    []cdispec.Device                `json:"devices,omitempty"`
}

func decodeDir(root string) []verdict {
	verdicts := []verdict{}
	err := filepath.WalkDir(root, func(path string, entry fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if entry.IsDir() {
			return nil
		}
		name := entry.Name()
		switch {
		case name == "metadata.json":
			verdicts = append(verdicts, decodeMetadata(path, entry))
		case strings.Contains(name, "_metadata_") && strings.HasSuffix(name, ".json"):
			verdicts = append(verdicts, decodeCDI(path, entry))
		}
		return nil
	})
	if err != nil {
		fail("walk %s: %v", root, err)
	}
	return verdicts
}

func fileMode(entry fs.DirEntry) string {
	info, err := entry.Info()
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%#o", info.Mode().Perm())
}

func decodeMetadata(path string, entry fs.DirEntry) verdict {
	v := verdict{Path: path, Kind: "metadata", Mode: fileMode(entry)}
	data, err := os.ReadFile(path)
	if err != nil {
		v.Error = err.Error()
		return v
	}
	var dm metadata.DeviceMetadata
	var gvk schema.GroupVersionKind
	var validation error
	err = devicemetadata.DecodeMetadataFromStream(
		json.NewDecoder(bytes.NewReader(data)), &dm,
		devicemetadata.DecodeMetadataWithValidationResult(&validation),
		devicemetadata.DecodeMetadataStoreGVKResult(&gvk),
	)
	switch {
	case err != nil:
		v.Error = "decode: " + err.Error()
	case validation != nil:
		v.Error = "validate: " + validation.Error()
	default:
		v.OK = true
	}
	if err == nil {
		v.GVK = gvk.String()
		// What a v1beta1 consumer reads, for the test to look at (the internal type has no JSON names).
		var versioned metadatav1beta1.DeviceMetadata
		if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &versioned); err != nil {
			v.OK, v.Error = false, "decode as v1beta1: "+err.Error()
		} else {
			v.Decoded = &versioned
		}
	}
	return v
}

func decodeCDI(path string, entry fs.DirEntry) verdict {
	v := verdict{Path: path, Kind: "cdi", Mode: fileMode(entry)}
	data, err := os.ReadFile(path)
	if err != nil {
		v.Error = err.Error()
		return v
	}
	var spec cdispec.Spec
	decoder := json.NewDecoder(bytes.NewReader(data))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&spec); err != nil {
		v.Error = "decode: " + err.Error()
		return v
	}
	v.CDIKind, v.CDIVersion, v.Devices = spec.Kind, spec.Version, spec.Devices
	minVersion, err := cdispec.MinimumRequiredVersion(&spec)
	if err != nil {
		v.Error = "minimum version: " + err.Error()
		return v
	}
	v.MinVersion = minVersion
	if err := cdispec.ValidateVersion(&spec); err != nil {
		v.Error = "version: " + err.Error()
		return v
	}
	v.OK = true
	return v
}

// --- write: upstream's helper -----------------------------------------------------------------------

type jobDevice struct {
	Requests     []string                               `json:"requests"`
	Pool         string                                 `json:"pool"`
	Device       string                                 `json:"device"`
	CDIDeviceIDs []string                               `json:"cdiDeviceIDs"`
	Attributes   map[string]resourceapi.DeviceAttribute `json:"attributes"`
}

type job struct {
	Driver    string                    `json:"driver"`
	Node      string                    `json:"node"`
	Versions  []string                  `json:"versions"`
	Claim     resourceapi.ResourceClaim `json:"claim"`
	Devices   []jobDevice               `json:"devices"`
	Unprepare bool                      `json:"unprepare"`
}

type devicePlugin struct{ job *job }

func (p devicePlugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	result := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		var devices []kubeletplugin.Device
		for _, d := range p.job.Devices {
			devices = append(devices, kubeletplugin.Device{
				Requests:     d.Requests,
				PoolName:     d.Pool,
				DeviceName:   d.Device,
				CDIDeviceIDs: d.CDIDeviceIDs,
				Metadata:     &kubeletplugin.DeviceMetadata{Attributes: d.Attributes},
			})
		}
		result[claim.UID] = kubeletplugin.PrepareResult{Devices: devices}
	}
	return result, nil
}

func (p devicePlugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	result := map[types.UID]error{}
	for _, claim := range claims {
		result[claim.UID] = nil
	}
	return result, nil
}

// WatchHealthStatus: the harness reports no health; the helper's health service is turned off.
func (p devicePlugin) WatchHealthStatus(ctx context.Context, _ chan<- kubeletplugin.DeviceHealthReport) error {
	<-ctx.Done()
	return nil
}

func (p devicePlugin) HandleError(_ context.Context, err error, msg string) {
	fmt.Fprintf(os.Stderr, "helper error: %s: %v\n", msg, err)
}

func runHelper(jobPath, out string) map[string]any {
	raw, err := os.ReadFile(jobPath)
	if err != nil {
		fail("read job: %v", err)
	}
	var j job
	if err := json.Unmarshal(raw, &j); err != nil {
		fail("decode job: %v", err)
	}
	var versions []schema.GroupVersion
	for _, v := range j.Versions {
		gv, err := schema.ParseGroupVersion(v)
		if err != nil {
			fail("version %q: %v", v, err)
		}
		versions = append(versions, gv)
	}
	pluginDir, cdiDir, registry := filepath.Join(out, "plugin"), filepath.Join(out, "cdi"), filepath.Join(out, "registry")
	for _, dir := range []string{pluginDir, cdiDir, registry} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fail("mkdir %s: %v", dir, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := fake.NewClientset(&j.Claim)
	helper, err := kubeletplugin.Start(ctx, devicePlugin{&j},
		kubeletplugin.DriverName(j.Driver),
		kubeletplugin.NodeName(j.Node),
		kubeletplugin.KubeClient(client),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.RegistrarDirectoryPath(registry),
		kubeletplugin.CDIDirectory(cdiDir),
		kubeletplugin.EnableDeviceMetadata(true, versions),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		fail("start helper: %v", err)
	}
	defer helper.Stop()

	socket, err := filepath.Abs(filepath.Join(pluginDir, "dra.sock"))
	if err != nil {
		fail("socket path: %v", err)
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail("dial helper: %v", err)
	}
	defer conn.Close()
	node := drapbv1.NewDRAPluginClient(conn)
	ref := &drapbv1.Claim{Namespace: j.Claim.Namespace, Name: j.Claim.Name, Uid: string(j.Claim.UID)}
	prepared, err := node.NodePrepareResources(ctx, &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{ref}})
	if err != nil {
		fail("NodePrepareResources: %v", err)
	}
	result := map[string]any{"prepare": prepared, "afterPrepare": listFiles(out)}
	if j.Unprepare {
		unprepared, err := node.NodeUnprepareResources(ctx, &drapbv1.NodeUnprepareResourcesRequest{Claims: []*drapbv1.Claim{ref}})
		if err != nil {
			fail("NodeUnprepareResources: %v", err)
		}
		result["unprepare"] = unprepared
		result["afterUnprepare"] = listFiles(out)
	}
	return result
}

// listFiles: what lies under root after a call, relative paths: each regular file's permission
// bits and content, each directory's bits (sockets left out), so a test compares names, modes and
// bytes.
type listed struct {
	Mode    string `json:"mode"`
	Dir     bool   `json:"dir,omitempty"`
	Content string `json:"content,omitempty"`
}

func listFiles(root string) map[string]listed {
	files := map[string]listed{}
	_ = filepath.WalkDir(root, func(path string, entry fs.DirEntry, err error) error {
		if err != nil || path == root {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		switch {
		case entry.IsDir():
			files[rel] = listed{Mode: fileMode(entry), Dir: true}
		case entry.Type().IsRegular():
			data, _ := os.ReadFile(path)
			files[rel] = listed{Mode: fileMode(entry), Content: string(data)}
		}
		return nil
	})
	return files
}

// --- output -----------------------------------------------------------------------------------------

func write(result any) {
	encoder := json.NewEncoder(os.Stdout)
	encoder.SetIndent("", "  ")
	if err := encoder.Encode(result); err != nil {
		fail("encode result: %v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "metadatacheck: "+format+"\n", args...)
	os.Exit(1)
}
