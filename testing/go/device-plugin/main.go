// Command grpojob-device-plugin advertises a machine's NVIDIA GPUs to the kubelet as nvidia.com/gpu
// through the kubelet's device-plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1), for the
// real test node of `grpojob_testing.cluster up --real-node` on a GPU machine (`make e2e-gpu`).
//
//	grpojob-device-plugin [--device-glob /dev/nvidia[0-9]*] [--lib-dir DIR ...]
//
// One device per node matching --device-glob (/dev/nvidia0, /dev/nvidia1, ...), named by its
// basename. Allocate gives the container the allocated device nodes and the driver's control nodes
// (nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset: those present at that moment, since
// nvidia-uvm appears only once CUDA has been used on the host), mounts the driver's user-space
// libraries read-only under /usr/local/nvidia/lib64 and its tools (nvidia-smi) under
// /usr/local/nvidia/bin, and sets LD_LIBRARY_PATH there. It sets no CUDA_VISIBLE_DEVICES: the
// container sees only the device nodes it was given, so CUDA numbers them from 0, which is what Ray
// (which sets CUDA_VISIBLE_DEVICES for its actors from the --num-gpus KubeRay passes) expects.
//
// What it does not do, unlike NVIDIA's own plugin with the NVIDIA container toolkit: no CDI, no
// MIG, no topology, no health events from NVML (a device is unhealthy when its node disappears),
// no GetPreferredAllocation. It re-registers when the kubelet restarts (the kubelet removes every
// socket in the device-plugin directory when it starts).
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// ContainerLibDir is where the driver's libraries appear in a container; ContainerBinDir, its tools.
const (
	ContainerLibDir = "/usr/local/nvidia/lib64"
	ContainerBinDir = "/usr/local/nvidia/bin"
)

// DefaultLibGlobs are the driver's compute and management libraries (what the NVIDIA container
// toolkit calls its "compute" and "utility" capabilities), by file name.
var DefaultLibGlobs = []string{
	"libcuda.so*",
	"libcudadebugger.so*",
	"libnvidia-ml.so*",
	"libnvidia-cfg.so*",
	"libnvidia-ptxjitcompiler.so*",
	"libnvidia-nvvm.so*",
	"libnvidia-gpucomp.so*",
	"libnvidia-allocator.so*",
	"libnvidia-opencl.so*",
}

// DefaultControlDevices are the driver's device nodes every GPU container needs besides its GPUs'.
var DefaultControlDevices = []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"}

// DefaultTools are the driver's programs put into every GPU container.
var DefaultTools = []string{"nvidia-smi"}

// Config is what the plugin advertises and hands out.
type Config struct {
	ResourceName   string
	DeviceGlob     string   // one device per match
	ControlDir     string   // where the control nodes live (the device glob's directory by default)
	ControlDevices []string // basenames under ControlDir
	LibDirs        []string // directories searched for the driver's libraries
	LibGlobs       []string
	ToolPaths      []string // the driver's programs, by host path
}

// Plugin serves the DevicePlugin service for one resource.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	config Config
	poll   time.Duration
	stop   chan struct{}
}

// NewPlugin returns a plugin that rescans its devices every poll interval.
func NewPlugin(config Config, poll time.Duration) *Plugin {
	return &Plugin{config: config, poll: poll, stop: make(chan struct{})}
}

// Devices lists the devices matching the glob, sorted, all healthy (they exist).
func (p *Plugin) Devices() ([]*pluginapi.Device, error) {
	paths, err := filepath.Glob(p.config.DeviceGlob)
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	devices := make([]*pluginapi.Device, 0, len(paths))
	for _, path := range paths {
		devices = append(devices, &pluginapi.Device{ID: filepath.Base(path), Health: pluginapi.Healthy})
	}
	return devices, nil
}

// GetDevicePluginOptions: nothing before a container starts, no preferred allocation.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the device list, then again whenever it changes, until the plugin stops.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	var last string
	ticker := time.NewTicker(p.poll)
	defer ticker.Stop()
	for {
		devices, err := p.Devices()
		if err != nil {
			return err
		}
		if key := fmt.Sprint(devices); key != last {
			if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
				return err
			}
			log.Printf("advertised %d %s: %s", len(devices), p.config.ResourceName, deviceIDs(devices))
			last = key
		}
		select {
		case <-p.stop:
			return nil
		case <-stream.Context().Done():
			return nil
		case <-ticker.C:
		}
	}
}

func deviceIDs(devices []*pluginapi.Device) string {
	ids := make([]string, len(devices))
	for i, device := range devices {
		ids[i] = device.ID
	}
	return strings.Join(ids, ",")
}

// Allocate answers each container's request with its device nodes, the control nodes, the
// driver's libraries and tools, and the environment that points at them.
func (p *Plugin) Allocate(_ context.Context, request *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	known, err := p.Devices()
	if err != nil {
		return nil, err
	}
	present := map[string]bool{}
	for _, device := range known {
		present[device.ID] = true
	}
	mounts, err := p.DriverMounts()
	if err != nil {
		return nil, err
	}
	response := &pluginapi.AllocateResponse{}
	for _, container := range request.ContainerRequests {
		var devices []*pluginapi.DeviceSpec
		for _, id := range container.DevicesIds {
			if !present[id] {
				return nil, fmt.Errorf("unknown device %q (known: %s)", id, deviceIDs(known))
			}
			devices = append(devices, deviceSpec(filepath.Join(filepath.Dir(p.config.DeviceGlob), id)))
		}
		for _, name := range p.config.ControlDevices {
			path := filepath.Join(p.controlDir(), name)
			if _, err := os.Stat(path); err == nil {
				devices = append(devices, deviceSpec(path))
			}
		}
		response.ContainerResponses = append(response.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Devices: devices,
			Mounts:  mounts,
			Envs: map[string]string{
				"NVIDIA_VISIBLE_DEVICES": strings.Join(container.DevicesIds, ","),
				"LD_LIBRARY_PATH":        ContainerLibDir,
				// Triton looks for libcuda with `ldconfig -p`, which knows nothing of the mounts.
				"TRITON_LIBCUDA_PATH": ContainerLibDir,
			},
		})
		log.Printf("allocated %s", strings.Join(container.DevicesIds, ","))
	}
	return response, nil
}

func (p *Plugin) controlDir() string {
	if p.config.ControlDir != "" {
		return p.config.ControlDir
	}
	return filepath.Dir(p.config.DeviceGlob)
}

func deviceSpec(hostPath string) *pluginapi.DeviceSpec {
	return &pluginapi.DeviceSpec{HostPath: hostPath, ContainerPath: "/dev/" + filepath.Base(hostPath), Permissions: "rw"}
}

// DriverMounts are the read-only mounts of the driver's libraries (each name once, from the first
// directory that has it; a symbolic link is mounted as the file it points to) and tools.
func (p *Plugin) DriverMounts() ([]*pluginapi.Mount, error) {
	var mounts []*pluginapi.Mount
	seen := map[string]bool{}
	for _, dir := range p.config.LibDirs {
		for _, pattern := range p.config.LibGlobs {
			paths, err := filepath.Glob(filepath.Join(dir, pattern))
			if err != nil {
				return nil, err
			}
			for _, path := range paths {
				name := filepath.Base(path)
				if seen[name] {
					continue
				}
				if info, err := os.Stat(path); err != nil || !info.Mode().IsRegular() {
					continue // a dangling link, or not a file
				}
				seen[name] = true
				mounts = append(mounts, &pluginapi.Mount{HostPath: path, ContainerPath: filepath.Join(ContainerLibDir, name), ReadOnly: true})
			}
		}
	}
	// Triton links its helpers with -lcuda, which needs the unversioned name; a driver installed
	// without it still has the soname, and that file will do.
	if !seen["libcuda.so"] {
		for _, mount := range mounts {
			if filepath.Base(mount.ContainerPath) == "libcuda.so.1" {
				mounts = append(mounts, &pluginapi.Mount{HostPath: mount.HostPath, ContainerPath: filepath.Join(ContainerLibDir, "libcuda.so"), ReadOnly: true})
				break
			}
		}
	}
	for _, path := range p.config.ToolPaths {
		mounts = append(mounts, &pluginapi.Mount{HostPath: path, ContainerPath: filepath.Join(ContainerBinDir, filepath.Base(path)), ReadOnly: true})
	}
	sort.Slice(mounts, func(i, j int) bool { return mounts[i].ContainerPath < mounts[j].ContainerPath })
	return mounts, nil
}

// LdconfigDirs are the directories holding libcuda.so.1 in the dynamic linker's cache (`ldconfig -p`).
func LdconfigDirs(ldconfigOutput []byte) []string {
	var dirs []string
	scanner := bufio.NewScanner(bytes.NewReader(ldconfigOutput))
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if !strings.HasPrefix(line, "libcuda.so") || !strings.Contains(line, "x86-64") {
			continue
		}
		if _, path, ok := strings.Cut(line, "=> "); ok {
			dirs = appendOnce(dirs, filepath.Dir(strings.TrimSpace(path)))
		}
	}
	return dirs
}

func appendOnce(list []string, item string) []string {
	for _, existing := range list {
		if existing == item {
			return list
		}
	}
	return append(list, item)
}

// Serve runs the plugin's gRPC server on socket, registers it with the kubelet at kubeletSocket,
// and serves until ctx ends or the socket is removed (the kubelet restarted); it returns then.
func (p *Plugin) Serve(ctx context.Context, socket, kubeletSocket string) error {
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return err
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, p)
	served := make(chan error, 1)
	go func() { served <- server.Serve(listener) }()
	defer func() {
		close(p.stop)
		server.Stop()
		_ = os.Remove(socket)
	}()
	if err := p.register(ctx, socket, kubeletSocket); err != nil {
		return err
	}
	log.Printf("registered %s at %s with the kubelet", p.config.ResourceName, socket)
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-served:
			return err
		case <-ticker.C:
			if _, err := os.Stat(socket); err != nil {
				log.Printf("%s is gone (the kubelet restarted?): registering again", socket)
				return nil
			}
		}
	}
}

func (p *Plugin) register(ctx context.Context, socket, kubeletSocket string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(socket), // the kubelet dials it in its own device-plugin directory
		ResourceName: p.config.ResourceName,
		Options:      &pluginapi.DevicePluginOptions{},
	}, grpc.WaitForReady(true))
	return err
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var libDirs, libGlobs, tools listFlag
	config := Config{ControlDevices: DefaultControlDevices}
	pluginDir := flag.String("plugin-dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory (its kubelet.sock)")
	flag.StringVar(&config.ResourceName, "resource", "nvidia.com/gpu", "the extended resource advertised")
	flag.StringVar(&config.DeviceGlob, "device-glob", "/dev/nvidia[0-9]*", "one device per matching node")
	flag.StringVar(&config.ControlDir, "control-dir", "", "directory of the control nodes (default: the device glob's)")
	flag.Var(&libDirs, "lib-dir", "a directory of the driver's libraries (repeatable; default: those of libcuda.so in `ldconfig -p`)")
	flag.Var(&libGlobs, "lib-glob", "a driver library's file name pattern (repeatable; default: the compute and management libraries)")
	flag.Var(&tools, "tool", "a driver program to mount into /usr/local/nvidia/bin (repeatable; default: nvidia-smi from PATH)")
	poll := flag.Duration("poll", 5*time.Second, "how often the devices are rescanned")
	flag.Parse()

	config.LibGlobs = libGlobs
	if len(config.LibGlobs) == 0 {
		config.LibGlobs = DefaultLibGlobs
	}
	config.LibDirs = libDirs
	if len(config.LibDirs) == 0 {
		if out, err := exec.Command("ldconfig", "-p").Output(); err == nil {
			config.LibDirs = LdconfigDirs(out)
		}
		// Where drivers are mounted into machines and containers when the linker's cache does not say.
		for _, dir := range []string{"/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"} {
			if matches, _ := filepath.Glob(filepath.Join(dir, "libcuda.so*")); len(matches) > 0 {
				config.LibDirs = appendOnce(config.LibDirs, dir)
			}
		}
	}
	config.ToolPaths = tools
	if len(tools) == 0 {
		for _, name := range DefaultTools {
			if path, err := exec.LookPath(name); err == nil {
				config.ToolPaths = append(config.ToolPaths, path)
			} else if _, err := os.Stat(filepath.Join("/usr/local/nvidia/bin", name)); err == nil {
				config.ToolPaths = append(config.ToolPaths, filepath.Join("/usr/local/nvidia/bin", name))
			}
		}
	}
	log.Printf("devices %s, driver libraries from %v, tools %v", config.DeviceGlob, config.LibDirs, config.ToolPaths)
	if len(config.LibDirs) == 0 {
		log.Printf("warning: no driver library directory (no libcuda.so in `ldconfig -p`; pass --lib-dir)")
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	socket := filepath.Join(*pluginDir, "grpojob-gpu.sock")
	kubeletSocket := filepath.Join(*pluginDir, "kubelet.sock")
	for ctx.Err() == nil {
		plugin := NewPlugin(config, *poll)
		if err := plugin.Serve(ctx, socket, kubeletSocket); err != nil {
			log.Printf("serving: %v; retrying in 2s", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
}
