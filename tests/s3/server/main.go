// Command s3server is the S3-compatible object store of tensorspark's `s3` test set: gofakes3
// (MIT) serving buckets kept as files in a folder (its s3afero backend; a directory marker, a
// key ending in "/", kept as a hidden file inside its folder: markers.go), each object written
// to a temporary file and renamed into place when whole, so an object is whole or absent
// after a kill, as on S3, and the data outlives a restart; behind an AWS Signature Version 4
// check of one access key pair, so wrong credentials are refused as a real store refuses
// them. (gofakes3's bbolt backend was not used: its objects alias the database's memory map
// after their transaction ends, which crashed a server-side copy.)
//
// The key pair comes from the environment (S3SERVER_ACCESS_KEY, S3SERVER_SECRET_KEY), never
// from the command line, where `ps` would show it.
package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3afero"
	"github.com/spf13/afero"
)

// newBackend keeps the buckets under root/buckets and their metadata under root/metadata
// (s3afero's layout), and the objects being written under root/tmp (one file system, so the
// final rename is atomic).
func newBackend(root string) (gofakes3.Backend, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	tmp := filepath.Join(root, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, err
	}
	fs := &atomicFs{Fs: afero.NewBasePathFs(afero.NewOsFs(), root), root: root, tmp: tmp}
	backend, err := s3afero.MultiBucket(fs)
	if err != nil {
		return nil, err
	}
	return &markers{Backend: &prefixes{Backend: backend, fs: fs}}, nil
}

// prefixes answers a listing under a prefix that is no folder (nothing there, or an object's
// own key followed by "/") with an empty list, as S3 does; s3afero reports a missing bucket
// or an error for those. A delete removes the folders it leaves empty, so a prefix with no
// object under it is listed nowhere, as on S3.
type prefixes struct {
	gofakes3.Backend
	fs afero.Fs
}

func (b *prefixes) ListBucket(bucket string, prefix *gofakes3.Prefix, page gofakes3.ListBucketPage) (*gofakes3.ObjectList, error) {
	if prefix != nil {
		if dir, _, ok := prefix.FilePrefix(); ok && dir != "" {
			if exists, err := b.Backend.BucketExists(bucket); err == nil && exists {
				st, err := b.fs.Stat(filepath.Join("buckets", bucket, filepath.FromSlash(dir)))
				if err != nil || !st.IsDir() {
					return gofakes3.NewObjectList(), nil
				}
			}
		}
	}
	return b.Backend.ListBucket(bucket, prefix, page)
}

func (b *prefixes) DeleteObject(bucket, object string) (gofakes3.ObjectDeleteResult, error) {
	result, err := b.Backend.DeleteObject(bucket, object)
	if err == nil {
		b.prune(bucket, object)
	}
	return result, err
}

func (b *prefixes) DeleteMulti(bucket string, objects ...string) (gofakes3.MultiDeleteResult, error) {
	result, err := b.Backend.DeleteMulti(bucket, objects...)
	for _, deleted := range result.Deleted {
		b.prune(bucket, deleted.Key)
	}
	return result, err
}

// prune removes the now empty folders above object, up to the bucket (Remove refuses a
// folder that is not empty, which ends the walk).
func (b *prefixes) prune(bucket, object string) {
	dir := path.Dir(object)
	for dir != "." && dir != "/" && dir != "" {
		if b.fs.Remove(filepath.Join("buckets", bucket, filepath.FromSlash(dir))) != nil {
			return
		}
		dir = path.Dir(dir)
	}
}

// atomicFs writes every file opened for a truncating write to a temporary file, renamed over
// the target on Close: a reader, or a restart after a kill, sees the old file or the new one.
type atomicFs struct {
	afero.Fs
	root, tmp string
}

func (a *atomicFs) Create(name string) (afero.File, error) {
	return a.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
}

func (a *atomicFs) OpenFile(name string, flag int, perm os.FileMode) (afero.File, error) {
	if flag&os.O_TRUNC == 0 || flag&(os.O_WRONLY|os.O_RDWR) == 0 {
		return a.Fs.OpenFile(name, flag, perm)
	}
	f, err := os.CreateTemp(a.tmp, "put-*")
	if err != nil {
		return nil, err
	}
	return &renameOnClose{File: f, dst: filepath.Join(a.root, filepath.Clean("/"+name))}, nil
}

type renameOnClose struct {
	*os.File
	dst string
}

func (r *renameOnClose) Close() error {
	if err := r.File.Close(); err != nil {
		return err
	}
	return os.Rename(r.File.Name(), r.dst)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "host:port to listen on")
	root := flag.String("root", "s3data", "folder holding every bucket, object and its metadata")
	buckets := flag.String("buckets", "", "comma-separated buckets to create at start")
	flag.Parse()
	access, secret := os.Getenv("S3SERVER_ACCESS_KEY"), os.Getenv("S3SERVER_SECRET_KEY")
	if access == "" || secret == "" {
		log.Fatal("s3server: set S3SERVER_ACCESS_KEY and S3SERVER_SECRET_KEY")
	}
	backend, err := newBackend(*root)
	if err != nil {
		log.Fatalf("s3server: %v", err)
	}
	for _, name := range strings.Split(*buckets, ",") {
		if name == "" {
			continue
		}
		if err := backend.CreateBucket(name); err != nil && !gofakes3.IsAlreadyExists(err) {
			log.Fatalf("s3server: create bucket %q: %v", name, err)
		}
	}
	faker := gofakes3.New(backend, gofakes3.WithLogger(errorsOnly{}))
	listener, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatalf("s3server: %v", err)
	}
	// The fixture waits for this line: the address actually bound.
	fmt.Printf("s3server listening on %s\n", listener.Addr())
	handler := &signed{next: faker.Server(), access: access, secret: secret}
	log.Fatal(http.Serve(listener, handler))
}

// errorsOnly logs gofakes3's errors (to stderr, the fixture's server.log), nothing else.
type errorsOnly struct{}

func (errorsOnly) Print(level gofakes3.LogLevel, v ...interface{}) {
	if level == gofakes3.LogErr {
		log.Println(append([]interface{}{"s3server:"}, v...)...)
	}
}

// signed passes on only requests signed (AWS Signature Version 4, Authorization header) with
// the server's key pair.
type signed struct {
	next           http.Handler
	access, secret string
}

func (s *signed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	code, msg := s.check(r)
	if code != "" {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>%s</Code>"+
			"<Message>%s</Message></Error>", code, msg)
		return
	}
	if r.Header.Get("Range") != "" {
		w = &partial{ResponseWriter: w}
	}
	s.next.ServeHTTP(w, r)
}

// partial drops the whole object's checksum headers from a ranged GET's answer, as S3 does
// (gofakes3 returns the stored ones, which a client then checks against the range).
type partial struct {
	http.ResponseWriter
	done bool
}

func (p *partial) strip() {
	if !p.done {
		for name := range p.Header() {
			if strings.HasPrefix(strings.ToLower(name), "x-amz-checksum-") {
				p.Header().Del(name)
			}
		}
		p.done = true
	}
}

func (p *partial) WriteHeader(code int) {
	p.strip()
	p.ResponseWriter.WriteHeader(code)
}

func (p *partial) Write(b []byte) (int, error) {
	p.strip()
	return p.ResponseWriter.Write(b)
}

func (s *signed) check(r *http.Request) (code, msg string) {
	auth := r.Header.Get("Authorization")
	const algo = "AWS4-HMAC-SHA256 "
	if !strings.HasPrefix(auth, algo) {
		return "AccessDenied", "Only requests signed with AWS Signature Version 4 are served."
	}
	fields := map[string]string{}
	for _, part := range strings.Split(auth[len(algo):], ",") {
		kv := strings.SplitN(strings.TrimSpace(part), "=", 2)
		if len(kv) == 2 {
			fields[kv[0]] = kv[1]
		}
	}
	cred := strings.SplitN(fields["Credential"], "/", 2)
	if len(cred) != 2 || fields["SignedHeaders"] == "" || fields["Signature"] == "" {
		return "AccessDenied", "Malformed Authorization header."
	}
	if cred[0] != s.access {
		return "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records."
	}
	scope := cred[1] // date/region/service/aws4_request
	parts := strings.Split(scope, "/")
	if len(parts) != 4 {
		return "AccessDenied", "Malformed credential scope."
	}
	signedHeaders := strings.Split(fields["SignedHeaders"], ";")
	canonical := strings.Join([]string{
		r.Method,
		strings.SplitN(r.RequestURI, "?", 2)[0],
		canonicalQuery(r.URL.RawQuery),
		canonicalHeaders(r, signedHeaders),
		fields["SignedHeaders"],
		r.Header.Get("X-Amz-Content-Sha256"),
	}, "\n")
	sum := sha256.Sum256([]byte(canonical))
	toSign := strings.Join([]string{
		"AWS4-HMAC-SHA256", r.Header.Get("X-Amz-Date"), scope, hex.EncodeToString(sum[:]),
	}, "\n")
	key := []byte("AWS4" + s.secret)
	for _, p := range parts {
		key = mac(key, p)
	}
	want := hex.EncodeToString(mac(key, toSign))
	if !hmac.Equal([]byte(want), []byte(fields["Signature"])) {
		return "SignatureDoesNotMatch", "The request signature we calculated does not match the signature you provided."
	}
	return "", ""
}

func mac(key []byte, data string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(data))
	return h.Sum(nil)
}

// uriEncode encodes as Signature Version 4 does: every byte but A-Z a-z 0-9 - _ . ~.
func uriEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
			c == '-' || c == '_' || c == '.' || c == '~' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

func canonicalQuery(raw string) string {
	if raw == "" {
		return ""
	}
	var pairs []string
	for _, item := range strings.Split(raw, "&") {
		if item == "" {
			continue
		}
		kv := strings.SplitN(item, "=", 2)
		k, _ := url.QueryUnescape(kv[0])
		v := ""
		if len(kv) == 2 {
			v, _ = url.QueryUnescape(kv[1])
		}
		pairs = append(pairs, uriEncode(k)+"="+uriEncode(v))
	}
	sort.Strings(pairs)
	return strings.Join(pairs, "&")
}

func canonicalHeaders(r *http.Request, names []string) string {
	var b strings.Builder
	for _, name := range names {
		var value string
		if name == "host" {
			value = r.Host
		} else {
			vals := r.Header.Values(name)
			for i, v := range vals {
				vals[i] = strings.Join(strings.Fields(v), " ")
			}
			value = strings.Join(vals, ",")
		}
		b.WriteString(name + ":" + value + "\n")
	}
	return b.String()
}
