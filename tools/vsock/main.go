// vmtax-vsock: the guest's end of vmtax's agent channel over vsock, for VMMs without a
// virtio-serial port (Firecracker, Cloud Hypervisor). It connects to the host (CID 2) on a
// vsock port, which the VMM forwards to the host's UNIX socket "<uds>_<port>", puts the
// connection on file descriptor 3, and executes the agent: the agent then speaks on fd 3
// exactly as on a virtio-serial port. Busybox has no vsock client, hence this static
// program (standard library only, built by Debian's Go).
//
// Usage: vmtax-vsock PORT PROGRAM [ARG...]
package main

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
	"unsafe"
)

const (
	afVsock = 40 // AF_VSOCK
	hostCID = 2  // VMADDR_CID_HOST
	// The vsock transport's driver may probe a moment after /init starts.
	tries = 500
	pause = 10 * time.Millisecond
)

// struct sockaddr_vm (linux/vm_sockets.h): family, reserved, port, cid, flags, zero.
type sockaddrVM struct {
	family   uint16
	reserved uint16
	port     uint32
	cid      uint32
	flags    uint8
	zero     [3]uint8
}

func connect(port uint32) (int, error) {
	addr := sockaddrVM{family: afVsock, port: port, cid: hostCID}
	var last error
	for i := 0; i < tries; i++ {
		fd, err := syscall.Socket(afVsock, syscall.SOCK_STREAM, 0)
		if err != nil {
			last = err
		} else {
			_, _, errno := syscall.Syscall(syscall.SYS_CONNECT, uintptr(fd),
				uintptr(unsafe.Pointer(&addr)), unsafe.Sizeof(addr))
			if errno == 0 {
				return fd, nil
			}
			last = errno
			syscall.Close(fd)
		}
		time.Sleep(pause)
	}
	return -1, last
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: vmtax-vsock PORT PROGRAM [ARG...]")
		os.Exit(2)
	}
	port, err := strconv.ParseUint(os.Args[1], 10, 32)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmtax-vsock: bad port %q\n", os.Args[1])
		os.Exit(2)
	}
	fd, err := connect(uint32(port))
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmtax-vsock: no connection to the host's vsock port %d: %v\n",
			port, err)
		os.Exit(1)
	}
	// dup2 leaves the copy without close-on-exec: the agent inherits fd 3.
	if err := syscall.Dup2(fd, 3); err != nil {
		fmt.Fprintf(os.Stderr, "vmtax-vsock: dup2: %v\n", err)
		os.Exit(1)
	}
	if fd != 3 {
		syscall.Close(fd)
	}
	err = syscall.Exec(os.Args[2], os.Args[2:], os.Environ())
	fmt.Fprintf(os.Stderr, "vmtax-vsock: exec %s: %v\n", os.Args[2], err)
	os.Exit(1)
}
