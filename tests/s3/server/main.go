// Command s3server is the S3-compatible object store of tensorspark's `s3` test set: gofakes3
// (MIT) serving buckets kept in one bbolt file (each PUT is one bbolt transaction, so an object
// is whole or absent after a kill, and the data outlives a restart), behind an AWS Signature
// Version 4 check of one access key pair, so wrong credentials are refused as a real store
// refuses them.
//
// The key pair comes from the environment (S3SERVER_ACCESS_KEY, S3SERVER_SECRET_KEY), never
// from the command line, where `ps` would show it.
package main

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3bolt"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "host:port to listen on")
	db := flag.String("db", "s3server.db", "bbolt file holding every bucket and object")
	buckets := flag.String("buckets", "", "comma-separated buckets to create at start")
	flag.Parse()
	access, secret := os.Getenv("S3SERVER_ACCESS_KEY"), os.Getenv("S3SERVER_SECRET_KEY")
	if access == "" || secret == "" {
		log.Fatal("s3server: set S3SERVER_ACCESS_KEY and S3SERVER_SECRET_KEY")
	}
	backend, err := s3bolt.NewFile(*db)
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
	faker := gofakes3.New(copying{backend}, gofakes3.WithLogger(gofakes3.DiscardLog()))
	listener, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatalf("s3server: %v", err)
	}
	// The fixture waits for this line: the address actually bound.
	fmt.Printf("s3server listening on %s\n", listener.Addr())
	handler := &signed{next: faker.Server(), access: access, secret: secret}
	log.Fatal(http.Serve(listener, handler))
}

// copying is the bbolt backend with a CopyObject that reads the source object into memory
// (its hash and bytes copied) before writing the copy. gofakes3's generic CopyObject, which
// s3bolt uses, hex-encodes the source's hash after the PUT, when that hash still points into
// bbolt's memory map of a closed read transaction: the server crashes (SIGSEGV) on the copy
// that Hadoop's s3a connector makes for every rename (a committed task's files, a Structured
// Streaming checkpoint's offsets and commits).
type copying struct {
	*s3bolt.Backend
}

func (c copying) CopyObject(srcBucket, srcKey, dstBucket, dstKey string, meta map[string]string) (gofakes3.CopyObjectResult, error) {
	src, err := c.Backend.GetObject(srcBucket, srcKey, nil)
	if err != nil {
		return gofakes3.CopyObjectResult{}, err
	}
	body, err := io.ReadAll(src.Contents)
	src.Contents.Close()
	if err != nil {
		return gofakes3.CopyObjectResult{}, err
	}
	hash := append([]byte(nil), src.Hash...)
	if _, err := c.Backend.PutObject(dstBucket, dstKey, meta, bytes.NewReader(body), int64(len(body)), nil); err != nil {
		return gofakes3.CopyObjectResult{}, err
	}
	return gofakes3.CopyObjectResult{
		ETag:         `"` + hex.EncodeToString(hash) + `"`,
		LastModified: gofakes3.NewContentTime(time.Now()),
	}, nil
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
	s.next.ServeHTTP(w, r)
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
