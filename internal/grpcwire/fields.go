package grpcwire

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// Field is one field of an encoded protobuf message: a varint's value or
// a length-delimited field's bytes (a string, a nested message, a packed
// list). Other wire types are skipped by EachField.
type Field struct {
	Num    protowire.Number
	Type   protowire.Type
	Varint uint64
	Bytes  []byte
}

// String is a string field's value, or an error naming the field when it
// came with another wire type.
func (f Field) String() (string, error) {
	if f.Type != protowire.BytesType {
		return "", fmt.Errorf("field %d: wire type %d where a string belongs", f.Num, f.Type)
	}
	return string(f.Bytes), nil
}

// Message is a nested message field's encoding.
func (f Field) Message() ([]byte, error) {
	if f.Type != protowire.BytesType {
		return nil, fmt.Errorf("field %d: wire type %d where a message belongs", f.Num, f.Type)
	}
	return f.Bytes, nil
}

// Int is a varint field's value.
func (f Field) Int() (int64, error) {
	if f.Type != protowire.VarintType {
		return 0, fmt.Errorf("field %d: wire type %d where a varint belongs", f.Num, f.Type)
	}
	return int64(f.Varint), nil
}

// EachField calls fn with each field of an encoded message, in wire order.
// Fields of fixed-width and group types are skipped, as fields a reader
// does not know are: none of the messages here has one.
func EachField(b []byte, fn func(Field) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("malformed message: %w", protowire.ParseError(n))
		}
		b = b[n:]
		f := Field{Num: num, Type: typ}
		switch typ {
		case protowire.VarintType:
			f.Varint, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			f.Bytes, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("malformed message: field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
		if typ != protowire.VarintType && typ != protowire.BytesType {
			continue
		}
		if err := fn(f); err != nil {
			return err
		}
	}
	return nil
}

// AppendString appends a string field; proto3 omits an empty one.
func AppendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// AppendRepeatedString appends a repeated string field, empty strings
// included (each element is sent).
func AppendRepeatedString(b []byte, num protowire.Number, ss []string) []byte {
	for _, s := range ss {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	return b
}

// AppendBool appends a bool field; proto3 omits false.
func AppendBool(b []byte, num protowire.Number, v bool) []byte {
	if !v {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, 1)
}

// AppendInt appends an int32 or int64 field; proto3 omits zero.
func AppendInt(b []byte, num protowire.Number, v int64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(v))
}

// AppendMessage appends a nested message field, even an empty one (a
// present message differs from an absent one). m appends the body.
func AppendMessage(b []byte, num protowire.Number, m Marshaler) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	// Reserve one length byte, the usual case, and move the body if the
	// length needs more.
	at := len(b)
	b = append(b, 0)
	b = m.AppendProto(b)
	n := len(b) - at - 1
	if n < 0x80 {
		b[at] = byte(n)
		return b
	}
	size := protowire.SizeVarint(uint64(n))
	b = append(b, make([]byte, size-1)...)
	copy(b[at+size:], b[at+1:at+1+n])
	protowire.AppendVarint(b[:at], uint64(n))
	return b
}

// AppendStringMap appends a map<string, string> field, keys in the order
// given (the caller sorts them for a stable encoding).
func AppendStringMap(b []byte, num protowire.Number, keys []string, m map[string]string) []byte {
	for _, k := range keys {
		v := m[k]
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(protowire.SizeTag(1)+protowire.SizeBytes(len(k))+protowire.SizeTag(2)+protowire.SizeBytes(len(v))))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, k)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, v)
	}
	return b
}

// MapEntry reads one map<string, string> entry.
func MapEntry(f Field) (key, value string, err error) {
	body, err := f.Message()
	if err != nil {
		return "", "", err
	}
	err = EachField(body, func(e Field) error {
		var err error
		switch e.Num {
		case 1:
			key, err = e.String()
		case 2:
			value, err = e.String()
		}
		return err
	})
	return key, value, err
}
