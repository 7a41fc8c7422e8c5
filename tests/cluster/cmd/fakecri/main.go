// Command fakecri is a container runtime (CRI) for tests: it answers the
// kubelet with the upstream fake runtime and records, for every
// CreateContainer call, the CDI device IDs and environment the kubelet asked
// for. Tests read that record to see what a real runtime would have received.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

// fakeImageSize is the size every "pulled" image reports.
const fakeImageSize = 1 << 20

// containerRecord is one line of the record file (JSON Lines).
type containerRecord struct {
	PodNamespace  string            `json:"podNamespace"`
	PodName       string            `json:"podName"`
	PodUID        string            `json:"podUID"`
	ContainerName string            `json:"containerName"`
	CDIDevices    []string          `json:"cdiDevices"`
	Env           map[string]string `json:"env"`
	Annotations   map[string]string `json:"annotations"`
}

// recordingRuntime embeds the fake so every RPC is promoted unchanged except
// CreateContainer, which is recorded first.
type recordingRuntime struct {
	*fake.RemoteRuntime
	mu     sync.Mutex
	record *os.File
}

func (r *recordingRuntime) CreateContainer(ctx context.Context, req *kubeapi.CreateContainerRequest) (*kubeapi.CreateContainerResponse, error) {
	rec := containerRecord{Env: map[string]string{}, CDIDevices: []string{}}
	if sc := req.GetSandboxConfig(); sc != nil && sc.GetMetadata() != nil {
		rec.PodNamespace = sc.GetMetadata().GetNamespace()
		rec.PodName = sc.GetMetadata().GetName()
		rec.PodUID = sc.GetMetadata().GetUid()
	}
	if cfg := req.GetConfig(); cfg != nil {
		rec.ContainerName = cfg.GetMetadata().GetName()
		for _, d := range cfg.GetCDIDevices() {
			rec.CDIDevices = append(rec.CDIDevices, d.GetName())
		}
		for _, kv := range cfg.GetEnvs() {
			rec.Env[kv.GetKey()] = string(kv.GetValue())
		}
		rec.Annotations = cfg.GetAnnotations()
	}
	line, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	_, err = r.record.Write(append(line, '\n'))
	if err == nil {
		err = r.record.Sync()
	}
	r.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("fakecri: recording CreateContainer: %w", err)
	}
	return r.RemoteRuntime.CreateContainer(ctx, req)
}

func main() {
	socket := flag.String("socket", "", "unix socket path to serve the CRI on")
	recordPath := flag.String("record", "", "file that receives one JSON line per CreateContainer")
	flag.Parse()
	if *socket == "" || *recordPath == "" {
		log.Fatal("fakecri: --socket and --record are required")
	}

	record, err := os.OpenFile(*recordPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		log.Fatalf("fakecri: %v", err)
	}
	inner := fake.NewFakeRemoteRuntime()
	// The kubelet refuses to start unless the runtime reports itself ready and
	// its cgroup driver agrees with the kubelet's own configuration.
	inner.RuntimeService.FakeStatus = &kubeapi.RuntimeStatus{Conditions: []*kubeapi.RuntimeCondition{
		{Type: kubeapi.RuntimeReady, Status: true},
		{Type: kubeapi.NetworkReady, Status: true},
	}}
	inner.RuntimeService.FakeLinuxConfiguration = &kubeapi.LinuxRuntimeConfiguration{CgroupDriver: kubeapi.CgroupDriver_CGROUPFS}
	// The kubelet refuses to create a container whose image reports size 0
	// ("Id or size of image ... is not set"); the fake pulls with this size.
	inner.ImageService.SetFakeImageSize(fakeImageSize)
	runtime := &recordingRuntime{RemoteRuntime: inner, record: record}

	_ = os.Remove(*socket)
	listener, err := net.Listen("unix", *socket)
	if err != nil {
		log.Fatalf("fakecri: listen on %s: %v", *socket, err)
	}
	server := grpc.NewServer()
	kubeapi.RegisterRuntimeServiceServer(server, runtime)
	kubeapi.RegisterImageServiceServer(server, runtime)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		server.Stop()
	}()
	log.Printf("fakecri: serving on %s, recording to %s", *socket, *recordPath)
	if err := server.Serve(listener); err != nil {
		log.Printf("fakecri: %v", err)
	}
	_ = os.Remove(*socket)
}
