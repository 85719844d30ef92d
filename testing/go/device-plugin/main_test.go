package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fakeHost lays out what a GPU machine has, as plain files in a temporary directory: two GPU nodes
// and nvidiactl under dev/, the driver's libraries (versioned file, soname link, dev link, and a
// library of another driver component that must not be mounted) under lib/, nvidia-smi under bin/.
func fakeHost(t *testing.T) (Config, string) {
	root := t.TempDir()
	for _, dir := range []string{"dev", "lib", "bin"} {
		if err := os.Mkdir(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	touch := func(path string) {
		if err := os.WriteFile(filepath.Join(root, path), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, path string) {
		if err := os.Symlink(target, filepath.Join(root, path)); err != nil {
			t.Fatal(err)
		}
	}
	for _, path := range []string{"dev/nvidia0", "dev/nvidia1", "dev/nvidiactl", "lib/libcuda.so.580.1", "lib/libnvidia-ml.so.580.1", "lib/libnvidia-glcore.so.580.1", "bin/nvidia-smi"} {
		touch(path)
	}
	link("libcuda.so.580.1", "lib/libcuda.so.1")
	link("libcuda.so.1", "lib/libcuda.so")
	link("libnvidia-ml.so.580.1", "lib/libnvidia-ml.so.1")
	link("missing.so", "lib/libnvidia-cfg.so.1")
	config := Config{
		ResourceName:   "nvidia.com/gpu",
		DeviceGlob:     filepath.Join(root, "dev", "nvidia[0-9]*"),
		ControlDevices: DefaultControlDevices,
		LibDirs:        []string{filepath.Join(root, "lib")},
		LibGlobs:       DefaultLibGlobs,
		ToolPaths:      []string{filepath.Join(root, "bin", "nvidia-smi")},
	}
	return config, root
}

func TestOneDevicePerGPUNodeNamedByItsBasename(t *testing.T) {
	config, _ := fakeHost(t)
	devices, err := NewPlugin(config, time.Second).Devices()
	if err != nil {
		t.Fatal(err)
	}
	if got := deviceIDs(devices); got != "nvidia0,nvidia1" {
		t.Fatalf("devices %s", got)
	}
	for _, device := range devices {
		if device.Health != pluginapi.Healthy {
			t.Fatalf("%s is %s", device.ID, device.Health)
		}
	}
}

func TestAllocateGivesTheDeviceTheControlNodesTheDriverLibrariesAndTools(t *testing.T) {
	config, root := fakeHost(t)
	response, err := NewPlugin(config, time.Second).Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"nvidia1"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(response.ContainerResponses) != 1 {
		t.Fatalf("%d container responses", len(response.ContainerResponses))
	}
	container := response.ContainerResponses[0]
	wantDevices := []*pluginapi.DeviceSpec{
		{HostPath: filepath.Join(root, "dev", "nvidia1"), ContainerPath: "/dev/nvidia1", Permissions: "rw"},
		// nvidia-uvm, nvidia-uvm-tools and nvidia-modeset are absent on this host, so not given.
		{HostPath: filepath.Join(root, "dev", "nvidiactl"), ContainerPath: "/dev/nvidiactl", Permissions: "rw"},
	}
	if !reflect.DeepEqual(container.Devices, wantDevices) {
		t.Fatalf("devices %v", container.Devices)
	}
	lib := filepath.Join(root, "lib")
	wantMounts := []*pluginapi.Mount{
		{HostPath: filepath.Join(root, "bin", "nvidia-smi"), ContainerPath: "/usr/local/nvidia/bin/nvidia-smi", ReadOnly: true},
		{HostPath: filepath.Join(lib, "libcuda.so"), ContainerPath: "/usr/local/nvidia/lib64/libcuda.so", ReadOnly: true},
		{HostPath: filepath.Join(lib, "libcuda.so.1"), ContainerPath: "/usr/local/nvidia/lib64/libcuda.so.1", ReadOnly: true},
		{HostPath: filepath.Join(lib, "libcuda.so.580.1"), ContainerPath: "/usr/local/nvidia/lib64/libcuda.so.580.1", ReadOnly: true},
		{HostPath: filepath.Join(lib, "libnvidia-ml.so.1"), ContainerPath: "/usr/local/nvidia/lib64/libnvidia-ml.so.1", ReadOnly: true},
		{HostPath: filepath.Join(lib, "libnvidia-ml.so.580.1"), ContainerPath: "/usr/local/nvidia/lib64/libnvidia-ml.so.580.1", ReadOnly: true},
	}
	if !reflect.DeepEqual(container.Mounts, wantMounts) {
		t.Fatalf("mounts %v", container.Mounts)
	}
	wantEnvs := map[string]string{
		"NVIDIA_VISIBLE_DEVICES": "nvidia1",
		"LD_LIBRARY_PATH":        "/usr/local/nvidia/lib64",
		"TRITON_LIBCUDA_PATH":    "/usr/local/nvidia/lib64",
	}
	if !reflect.DeepEqual(container.Envs, wantEnvs) {
		t.Fatalf("envs %v", container.Envs)
	}
	if _, ok := container.Envs["CUDA_VISIBLE_DEVICES"]; ok {
		t.Fatal("CUDA_VISIBLE_DEVICES set: the container sees only its own GPUs, numbered from 0")
	}
}

func TestADriverWithoutTheUnversionedLibcudaGetsItFromTheSoname(t *testing.T) {
	config, root := fakeHost(t)
	if err := os.Remove(filepath.Join(root, "lib", "libcuda.so")); err != nil {
		t.Fatal(err)
	}
	mounts, err := NewPlugin(config, time.Second).DriverMounts()
	if err != nil {
		t.Fatal(err)
	}
	for _, mount := range mounts {
		if mount.ContainerPath == "/usr/local/nvidia/lib64/libcuda.so" {
			if mount.HostPath != filepath.Join(root, "lib", "libcuda.so.1") {
				t.Fatalf("libcuda.so from %s", mount.HostPath)
			}
			return
		}
	}
	t.Fatalf("no libcuda.so among %v", mounts)
}

func TestAllocateRefusesADeviceItDoesNotHave(t *testing.T) {
	config, _ := fakeHost(t)
	_, err := NewPlugin(config, time.Second).Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"nvidia7"}}},
	})
	if err == nil {
		t.Fatal("nvidia7 allocated")
	}
}

func TestLibraryDirectoriesComeFromLdconfigsLibcudaEntries(t *testing.T) {
	out := []byte(`1234 libs found in cache ` + "`/etc/ld.so.cache'" + `
	libcuda.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libcuda.so.1
	libcuda.so (libc6,x86-64) => /usr/local/nvidia/lib64/libcuda.so
	libcuda.so.1 (libc6) => /usr/lib32/libcuda.so.1
	libc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6
`)
	if got := LdconfigDirs(out); !reflect.DeepEqual(got, []string{"/usr/local/nvidia/lib64"}) {
		t.Fatalf("dirs %v", got)
	}
}

// fakeKubelet is the kubelet's side of registration: it records the request and then, as the
// kubelet does, dials the plugin's endpoint in the same directory.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	registered chan *pluginapi.RegisterRequest
}

func (k *fakeKubelet) Register(_ context.Context, request *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.registered <- request
	return &pluginapi.Empty{}, nil
}

func TestRegistersWithTheKubeletAndServesListAndWatchAndAllocateOnItsSocket(t *testing.T) {
	config, _ := fakeHost(t)
	dir, err := os.MkdirTemp("", "dp") // short: a unix socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	kubeletSocket := filepath.Join(dir, "kubelet.sock")
	listener, err := net.Listen("unix", kubeletSocket)
	if err != nil {
		t.Fatal(err)
	}
	kubelet := &fakeKubelet{registered: make(chan *pluginapi.RegisterRequest, 1)}
	server := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(server, kubelet)
	go func() { _ = server.Serve(listener) }()
	defer server.Stop()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() {
		served <- NewPlugin(config, 50*time.Millisecond).Serve(ctx, filepath.Join(dir, "grpojob-gpu.sock"), kubeletSocket)
	}()

	var request *pluginapi.RegisterRequest
	select {
	case request = <-kubelet.registered:
	case err := <-served:
		t.Fatalf("the plugin stopped before registering: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no registration")
	}
	if request.Version != "v1beta1" || request.ResourceName != "nvidia.com/gpu" || request.Endpoint != "grpojob-gpu.sock" {
		t.Fatalf("registration %v", request)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, request.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := deviceIDs(first.Devices); got != "nvidia0,nvidia1" {
		t.Fatalf("listed %s", got)
	}
	// A GPU node that goes away is reported at the next scan.
	if err := os.Remove(filepath.Join(filepath.Dir(config.DeviceGlob), "nvidia1")); err != nil {
		t.Fatal(err)
	}
	second, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := deviceIDs(second.Devices); got != "nvidia0" {
		t.Fatalf("listed %s after nvidia1 went", got)
	}
	allocated, err := client.Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"nvidia0"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := allocated.ContainerResponses[0].Devices[0].ContainerPath; got != "/dev/nvidia0" {
		t.Fatalf("allocated %s", got)
	}
	// The kubelet removes every socket of its directory when it restarts: the plugin returns, to
	// register again.
	if err := os.Remove(filepath.Join(dir, "grpojob-gpu.sock")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the plugin did not notice its socket was removed")
	}
}
