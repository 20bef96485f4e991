package docker

import (
	"errors"
	"fmt"
)

// A minimal decoder of BuildKit's StatusResponse protobuf
// (github.com/moby/buildkit/api/services/control/control.proto), which the
// engine sends base64-encoded in "moby.buildkit.trace" aux messages. Only the
// fields progress needs are read; everything else is skipped by wire type.
// (moby/moby/client does not depend on buildkit, and pulling buildkit in for
// three messages is not worth it.)
//
//	message StatusResponse { repeated Vertex vertexes = 1; repeated VertexStatus statuses = 2;
//	                         repeated VertexLog logs = 3; repeated VertexWarning warnings = 4; }
//	message Vertex    { string digest = 1; repeated string inputs = 2; string name = 3; bool cached = 4;
//	                    Timestamp started = 5; Timestamp completed = 6; string error = 7; … }
//	message VertexLog { string vertex = 1; Timestamp timestamp = 2; int64 stream = 3; bytes msg = 4; }
//	message VertexWarning { string vertex = 1; int64 level = 2; bytes short = 3; … }

type bkVertex struct {
	Digest    string
	Name      string
	Cached    bool
	Started   bool
	Completed bool
	Error     string
}

type bkLog struct {
	Vertex string
	Stream int64
	Msg    []byte
}

type bkWarning struct {
	Vertex string
	Short  string
}

type bkStatus struct {
	Vertexes []bkVertex
	Logs     []bkLog
	Warnings []bkWarning
}

var errProtoTruncated = errors.New("truncated protobuf")

const (
	wireVarint = 0
	wireI64    = 1
	wireBytes  = 2
	wireI32    = 5
)

// protoFields calls fn for each field of one message. For wire type 2 b is
// the field's bytes; for varints v is the value.
func protoFields(data []byte, fn func(num int, typ int, v uint64, b []byte) error) error {
	for len(data) > 0 {
		key, n := protoVarint(data)
		if n <= 0 {
			return errProtoTruncated
		}
		data = data[n:]
		num, typ := int(key>>3), int(key&7)
		switch typ {
		case wireVarint:
			v, n := protoVarint(data)
			if n <= 0 {
				return errProtoTruncated
			}
			data = data[n:]
			if err := fn(num, typ, v, nil); err != nil {
				return err
			}
		case wireI64:
			if len(data) < 8 {
				return errProtoTruncated
			}
			data = data[8:]
		case wireI32:
			if len(data) < 4 {
				return errProtoTruncated
			}
			data = data[4:]
		case wireBytes:
			l, n := protoVarint(data)
			if n <= 0 || uint64(len(data)-n) < l {
				return errProtoTruncated
			}
			b := data[n : n+int(l)]
			data = data[n+int(l):]
			if err := fn(num, typ, 0, b); err != nil {
				return err
			}
		default:
			return fmt.Errorf("protobuf wire type %d not supported", typ)
		}
	}
	return nil
}

// protoVarint decodes a varint; n is 0 when data is truncated, -1 on overflow.
func protoVarint(data []byte) (v uint64, n int) {
	for i, b := range data {
		if i == 10 {
			return 0, -1
		}
		v |= uint64(b&0x7f) << (7 * i)
		if b < 0x80 {
			return v, i + 1
		}
	}
	return 0, 0
}

func decodeBuildKitStatus(data []byte) (bkStatus, error) {
	var st bkStatus
	err := protoFields(data, func(num, typ int, _ uint64, b []byte) error {
		if typ != wireBytes {
			return nil
		}
		switch num {
		case 1:
			var v bkVertex
			err := protoFields(b, func(num, typ int, x uint64, b []byte) error {
				switch {
				case num == 1 && typ == wireBytes:
					v.Digest = string(b)
				case num == 3 && typ == wireBytes:
					v.Name = string(b)
				case num == 4 && typ == wireVarint:
					v.Cached = x != 0
				case num == 5 && typ == wireBytes:
					v.Started = true
				case num == 6 && typ == wireBytes:
					v.Completed = true
				case num == 7 && typ == wireBytes:
					v.Error = string(b)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("vertex: %w", err)
			}
			st.Vertexes = append(st.Vertexes, v)
		case 3:
			var l bkLog
			err := protoFields(b, func(num, typ int, x uint64, b []byte) error {
				switch {
				case num == 1 && typ == wireBytes:
					l.Vertex = string(b)
				case num == 3 && typ == wireVarint:
					l.Stream = int64(x)
				case num == 4 && typ == wireBytes:
					l.Msg = b
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("log: %w", err)
			}
			st.Logs = append(st.Logs, l)
		case 4:
			var w bkWarning
			err := protoFields(b, func(num, typ int, _ uint64, b []byte) error {
				switch {
				case num == 1 && typ == wireBytes:
					w.Vertex = string(b)
				case num == 3 && typ == wireBytes:
					w.Short = string(b)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("warning: %w", err)
			}
			st.Warnings = append(st.Warnings, w)
		}
		return nil
	})
	return st, err
}
