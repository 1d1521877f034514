// httpd is the server of vmtax's `serving` workload: the same static binary in every
// target (native, container, VM). Standard library only, so its build needs no download.
//
//	GET  /download/SIZE          SIZE bytes of deterministic content
//	POST /upload?to=disk|tmp|discard
//	                             stores the body in -disk, in -tmp or nowhere; answers its
//	                             length and SHA-256 as JSON and removes the file
//	POST /transcode              runs ffmpeg on the posted clip, answers the result
//	GET  /stored                 how many files uploads and transcodes left (JSON)
//	GET  /health                 "ok"
//
// A body over -max-body gets 413 Request Entity Too Large.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Filesystems that keep files in memory: tmpfs, and ramfs (an initramfs root).
var inMemory = map[int64]bool{0x01021994: true, 0x858458f6: true}

// memoryDir is the first candidate directory whose filesystem keeps files in memory.
func memoryDir(candidates []string) (string, error) {
	for _, dir := range candidates {
		var fs syscall.Statfs_t
		if syscall.Statfs(dir, &fs) == nil && inMemory[int64(fs.Type)] {
			return dir, nil
		}
	}
	return "", fmt.Errorf("none of %v is on tmpfs or ramfs (set -tmp)", candidates)
}

// The download pattern: one 64 KiB block of a fixed byte sequence, repeated.
var block = func() []byte {
	b := make([]byte, 64<<10)
	var x uint32 = 2463534242
	for i := range b {
		// xorshift32: cheap, deterministic, not compressible by the network path.
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}()

type server struct {
	disk, tmp, ffmpeg string
	maxBody           int64
	maxDownload       int64
	transcodeArgs     []string
}

func (s *server) download(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "GET only", http.StatusMethodNotAllowed)
		return
	}
	size, err := strconv.ParseInt(strings.TrimPrefix(r.URL.Path, "/download/"), 10, 64)
	if err != nil || size < 0 || size > s.maxDownload {
		http.Error(w, fmt.Sprintf("SIZE must be 0..%d bytes", s.maxDownload), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	for size > 0 {
		n := int64(len(block))
		if size < n {
			n = size
		}
		if _, err := w.Write(block[:n]); err != nil {
			return
		}
		size -= n
	}
}

type uploaded struct {
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
	To     string `json:"to"`
}

// body is the request body limited to maxBody; reading past it fails with *http.MaxBytesError.
func (s *server) body(w http.ResponseWriter, r *http.Request) (io.Reader, bool) {
	if r.ContentLength > s.maxBody {
		http.Error(w, fmt.Sprintf("body over %d bytes", s.maxBody), http.StatusRequestEntityTooLarge)
		return nil, false
	}
	return http.MaxBytesReader(w, r.Body, s.maxBody), true
}

func fail(w http.ResponseWriter, err error) {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

func (s *server) upload(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	to := r.URL.Query().Get("to")
	dir := map[string]string{"disk": s.disk, "tmp": s.tmp, "discard": ""}
	where, known := dir[to]
	if !known {
		http.Error(w, "to must be disk, tmp or discard", http.StatusBadRequest)
		return
	}
	body, ok := s.body(w, r)
	if !ok {
		return
	}
	hash := sha256.New()
	sink := io.Writer(hash)
	var file *os.File
	if where != "" {
		f, err := os.CreateTemp(where, "upload-*")
		if err != nil {
			fail(w, err)
			return
		}
		// The stored copy is only there to be written: nothing is left behind.
		defer os.Remove(f.Name())
		defer f.Close()
		file, sink = f, io.MultiWriter(f, hash)
	}
	n, err := io.Copy(sink, body)
	if err == nil && file != nil {
		// On disk means on the disk, not in the page cache.
		err = file.Sync()
	}
	if err != nil {
		fail(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(uploaded{n, hex.EncodeToString(hash.Sum(nil)), to})
}

func (s *server) transcode(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	body, ok := s.body(w, r)
	if !ok {
		return
	}
	work, err := os.MkdirTemp(s.tmp, "transcode-")
	if err != nil {
		fail(w, err)
		return
	}
	defer os.RemoveAll(work)
	in, out := filepath.Join(work, "in"), filepath.Join(work, "out.mp4")
	f, err := os.Create(in)
	if err == nil {
		_, err = io.Copy(f, body)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fail(w, err)
		return
	}
	argv := append([]string{"-nostdin", "-hide_banner", "-loglevel", "error", "-i", in},
		append(s.transcodeArgs, "-y", out)...)
	// A request its client gave up on stops its ffmpeg, and so removes its files.
	if msg, err := exec.CommandContext(r.Context(), s.ffmpeg, argv...).CombinedOutput(); err != nil {
		http.Error(w, fmt.Sprintf("ffmpeg: %v: %s", err, msg), http.StatusUnprocessableEntity)
		return
	}
	w.Header().Set("Content-Type", "video/mp4")
	http.ServeFile(w, r, out)
}

// privateDir makes this server's directory in parent, removed when SIGTERM or SIGINT
// stops the server. Natively parent is the host's /dev/shm: the directories of servers
// that died without removing theirs are removed first.
func privateDir(parent string) (string, error) {
	stale, _ := filepath.Glob(filepath.Join(parent, "vmtax-httpd-*"))
	for _, dir := range stale {
		pid := strings.TrimPrefix(filepath.Base(dir), "vmtax-httpd-")
		if _, err := os.Stat("/proc/" + pid); os.IsNotExist(err) {
			os.RemoveAll(dir)
		}
	}
	dir := filepath.Join(parent, fmt.Sprintf("vmtax-httpd-%d", os.Getpid()))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		os.RemoveAll(dir)
		os.Exit(0)
	}()
	return dir, nil
}

// stored answers how many files uploads and transcodes left behind (0 after every request).
func (s *server) stored(w http.ResponseWriter, r *http.Request) {
	count := 0
	for _, pattern := range []string{filepath.Join(s.disk, "upload-*"),
		filepath.Join(s.tmp, "upload-*"), filepath.Join(s.tmp, "transcode-*")} {
		found, err := filepath.Glob(pattern)
		if err != nil {
			fail(w, err)
			return
		}
		count += len(found)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]int{"files": count})
}

func main() {
	listen := flag.String("listen", ":8080", "address to listen on")
	disk := flag.String("disk", "uploads", "directory on disk for uploads (created)")
	tmp := flag.String("tmp", "", "directory on tmpfs for uploads and transcoding "+
		"(default: /dev/shm or /tmp, whichever is in memory)")
	maxBody := flag.Int64("max-body", 64<<20, "largest request body in bytes (413 above)")
	maxDownload := flag.Int64("max-download", 1<<30, "largest download in bytes")
	ffmpeg := flag.String("ffmpeg", "ffmpeg", "the ffmpeg program")
	args := flag.String("transcode-args", "-vf scale=320:180 -c:v libx264 -preset ultrafast -an",
		"ffmpeg's output options for /transcode, space-separated")
	version := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *version {
		fmt.Println("vmtax httpd, built by", runtime.Version())
		return
	}
	if err := os.MkdirAll(*disk, 0o755); err != nil {
		log.Fatal(err)
	}
	if *tmp == "" {
		dir, err := memoryDir([]string{"/dev/shm", "/tmp"})
		if err != nil {
			log.Fatal(err)
		}
		*tmp = dir
	}
	work, err := privateDir(*tmp)
	if err != nil {
		log.Fatal(err)
	}
	*tmp = work
	s := &server{disk: *disk, tmp: *tmp, ffmpeg: *ffmpeg, maxBody: *maxBody,
		maxDownload: *maxDownload, transcodeArgs: strings.Fields(*args)}
	mux := http.NewServeMux()
	mux.HandleFunc("/download/", s.download)
	mux.HandleFunc("/upload", s.upload)
	mux.HandleFunc("/transcode", s.transcode)
	mux.HandleFunc("/stored", s.stored)
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 30 * time.Second}
	log.Fatal(srv.Serve(ln))
}
