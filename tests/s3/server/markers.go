package main

import (
	"io"
	"path"
	"sort"
	"strings"

	"github.com/johannesboyne/gofakes3"
)

// markerName is the hidden file inside folder a/b that holds the directory-marker object
// "a/b/" (a key ending in "/", which Spark's s3a connector writes for every folder it makes).
// Kept as a file named "a/b" it would block every later key under a/b ("not a directory").
const markerName = ".s3-dir-marker"

// markers maps keys ending in "/" onto markerName inside their folder and back, so a marker
// and the keys under it coexist as they do on S3. A key whose last part is markerName itself
// is refused (it would alias a marker).
type markers struct {
	gofakes3.Backend
}

// stored is the name key is kept under.
func stored(key string) string {
	if strings.HasSuffix(key, "/") {
		return key + markerName
	}
	return key
}

// listed is the key a stored name is listed as.
func listed(name string) string {
	if name == markerName {
		return "/"
	}
	if strings.HasSuffix(name, "/"+markerName) {
		return strings.TrimSuffix(name, markerName)
	}
	return name
}

func reserved(key string) error {
	if path.Base(key) == markerName && !strings.HasSuffix(key, "/") {
		return gofakes3.ErrorMessagef(gofakes3.ErrInvalidArgument,
			"keys named %q are reserved by this test server", markerName)
	}
	return nil
}

func (m *markers) ListBucket(bucket string, prefix *gofakes3.Prefix, page gofakes3.ListBucketPage) (*gofakes3.ObjectList, error) {
	list, err := m.Backend.ListBucket(bucket, prefix, page)
	if err != nil || list == nil {
		return list, err
	}
	// The stored name extends the listed key, so the inner listing holds every match; filter
	// again on the listed keys and sort them as S3 does.
	kept := list.Contents[:0]
	for _, item := range list.Contents {
		item.Key = listed(item.Key)
		if prefix == nil || prefix.Match(item.Key, nil) {
			kept = append(kept, item)
		}
	}
	list.Contents = kept
	sort.Slice(list.Contents, func(i, j int) bool { return list.Contents[i].Key < list.Contents[j].Key })
	return list, nil
}

func (m *markers) HeadObject(bucket, key string) (*gofakes3.Object, error) {
	if err := reserved(key); err != nil {
		return nil, gofakes3.KeyNotFound(key)
	}
	obj, err := m.Backend.HeadObject(bucket, stored(key))
	if obj != nil {
		obj.Name = key
	}
	return obj, err
}

func (m *markers) GetObject(bucket, key string, rng *gofakes3.ObjectRangeRequest) (*gofakes3.Object, error) {
	if err := reserved(key); err != nil {
		return nil, gofakes3.KeyNotFound(key)
	}
	obj, err := m.Backend.GetObject(bucket, stored(key), rng)
	if obj != nil {
		obj.Name = key
	}
	return obj, err
}

func (m *markers) PutObject(bucket, key string, meta map[string]string, input io.Reader, size int64, cond *gofakes3.PutConditions) (gofakes3.PutObjectResult, error) {
	if err := reserved(key); err != nil {
		return gofakes3.PutObjectResult{}, err
	}
	return m.Backend.PutObject(bucket, stored(key), meta, input, size, cond)
}

func (m *markers) CopyObject(srcBucket, srcKey, dstBucket, dstKey string, meta map[string]string) (gofakes3.CopyObjectResult, error) {
	if err := reserved(dstKey); err != nil {
		return gofakes3.CopyObjectResult{}, err
	}
	if err := reserved(srcKey); err != nil {
		return gofakes3.CopyObjectResult{}, gofakes3.KeyNotFound(srcKey)
	}
	return m.Backend.CopyObject(srcBucket, stored(srcKey), dstBucket, stored(dstKey), meta)
}

func (m *markers) DeleteObject(bucket, key string) (gofakes3.ObjectDeleteResult, error) {
	if reserved(key) != nil {
		return gofakes3.ObjectDeleteResult{}, nil // nothing stored under that key
	}
	return m.Backend.DeleteObject(bucket, stored(key))
}

func (m *markers) DeleteMulti(bucket string, keys ...string) (gofakes3.MultiDeleteResult, error) {
	names := make([]string, 0, len(keys))
	for _, key := range keys {
		if reserved(key) == nil {
			names = append(names, stored(key))
		}
	}
	result, err := m.Backend.DeleteMulti(bucket, names...)
	for i := range result.Deleted {
		result.Deleted[i].Key = listed(result.Deleted[i].Key)
	}
	for i := range result.Error {
		result.Error[i].Key = listed(result.Error[i].Key)
	}
	return result, err
}
