// Command grpojob-probe is the one program in the real test node's own images.
//
//	grpojob-probe                 wait for SIGTERM or SIGINT, reaping children (the pod sandbox)
//	grpojob-probe exit CODE       exit with CODE
//	grpojob-probe serve ADDR TEXT answer every HTTP request on ADDR with TEXT
//	grpojob-probe get URL         print the body of URL; fail unless the status is 200 (a refused
//	                              connection is retried for up to 20 s: kube-proxy programs a
//	                              Service's rules a moment after its endpoints change)
//	grpojob-probe lookup NAME     print the addresses NAME resolves to; fail if none
//	grpojob-probe devices PATH... print each path and whether it is a character device, then the
//	                              environment (what a device plugin gave); fail if a path is missing
package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		os.Exit(pause())
	}
	var err error
	switch args := os.Args[2:]; os.Args[1] {
	case "exit":
		code, convErr := strconv.Atoi(arg(args, 0))
		if convErr != nil {
			err = convErr
			break
		}
		os.Exit(code)
	case "serve":
		err = serve(arg(args, 0), arg(args, 1))
	case "get":
		err = get(arg(args, 0))
	case "lookup":
		err = lookup(arg(args, 0))
	case "devices":
		err = devices(args)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpojob-probe:", err)
		os.Exit(2)
	}
}

func arg(args []string, i int) string {
	if i < len(args) {
		return args[i]
	}
	return ""
}

// pause blocks until SIGTERM or SIGINT; as PID 1 of a shared process namespace it reaps orphans.
func pause() int {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			return 0
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
	return 0
}

func serve(addr, text string) error {
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, text)
	})
	return http.ListenAndServe(addr, handler)
}

func get(url string) error {
	client := http.Client{Timeout: 10 * time.Second}
	deadline := time.Now().Add(20 * time.Second)
	response, err := client.Get(url)
	for err != nil && errors.Is(err, syscall.ECONNREFUSED) && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		response, err = client.Get(url)
	}
	if err != nil {
		return err
	}
	defer response.Body.Close()
	body, err := io.ReadAll(response.Body)
	if err != nil {
		return err
	}
	fmt.Println(string(body))
	if response.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", url, response.Status)
	}
	return nil
}

func lookup(name string) error {
	addrs, err := net.LookupHost(name)
	if err != nil {
		return err
	}
	for _, addr := range addrs {
		fmt.Println(addr)
	}
	return nil
}

func devices(paths []string) error {
	var missing []string
	for _, path := range paths {
		info, err := os.Stat(path)
		if err != nil {
			fmt.Printf("%s missing\n", path)
			missing = append(missing, path)
			continue
		}
		fmt.Printf("%s char-device=%t\n", path, info.Mode()&os.ModeCharDevice != 0)
	}
	for _, variable := range os.Environ() {
		fmt.Println(variable)
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing: %v", missing)
	}
	return nil
}
