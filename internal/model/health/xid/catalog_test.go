package xid

import (
	"slices"
	"testing"
)

// TestCatalogRows: one row per XID, ascending, each with a name and one of
// the catalog's buckets; a class or remedy other than the bucket's says why.
func TestCatalogRows(t *testing.T) {
	buckets := []Bucket{BucketRestartApp, BucketIgnore, BucketResetGPU, BucketRestartBM, BucketRestartVM, BucketContactSupport,
		BucketCheckMechanicals, BucketCheckUVM, BucketUpdateSWFW, BucketXID154, BucketWorkflowXID45, BucketWorkflowXID48,
		BucketWorkflowNVLink, BucketWorkflowNVLink5}
	remedies := []Remedy{RemedyWatch, RemedyReset, RemedyHuman, RemedyReboot}
	for i, e := range Catalog() {
		if i > 0 && e.XID <= catalog[i-1].XID {
			t.Errorf("row %d: XID %d after %d; want ascending, once each", i, e.XID, catalog[i-1].XID)
		}
		if e.Name == "" {
			t.Errorf("XID %d has no name", e.XID)
		}
		if !slices.Contains(buckets, e.Bucket) {
			t.Errorf("XID %d: bucket %q is none of the catalog's", e.XID, e.Bucket)
		}
		if !slices.Contains(Classes(), e.Health) {
			t.Errorf("XID %d: class %q", e.XID, e.Health)
		}
		if (e.Health != ClassOf(e.Bucket)) != (e.Note != "") {
			t.Errorf("XID %d: class %s, bucket %s gives %s, note %q: a note must say why, and only then", e.XID, e.Health, e.Bucket, ClassOf(e.Bucket), e.Note)
		}
		if !slices.Contains(remedies, e.Remedy) {
			t.Errorf("XID %d: remedy %q", e.XID, e.Remedy)
		}
		if (e.Remedy == RemedyWatch) != (e.Why == "") {
			t.Errorf("XID %d: remedy %s with why %q: a remedy says why, watch says nothing", e.XID, e.Remedy, e.Why)
		}
	}
}

func TestLookup(t *testing.T) {
	for _, tc := range []struct {
		xid    uint64
		known  bool
		class  Class
		remedy Remedy
		name   string
	}{
		{79, true, Fatal, RemedyReboot, "fallen off the bus"},
		{13, true, Ignore, RemedyWatch, "graphics engine exception"},
		{94, true, Transient, RemedyReset, "contained ECC error"},
		{109, true, Fatal, RemedyReset, "context switch timeout"},
		{8, true, Ignore, RemedyWatch, "GPU stopped processing"},
		{161, true, Ignore, RemedyWatch, "channel retirement failure"},
		{1, false, Transient, RemedyWatch, ""},
		{999, false, Transient, RemedyWatch, ""},
	} {
		e, ok := Lookup(tc.xid)
		if ok != tc.known || e.XID != tc.xid || e.Health != tc.class || e.Remedy != tc.remedy || Name(tc.xid) != tc.name {
			t.Errorf("Lookup(%d) = %+v, %v; want known %v, %s, %s, %q", tc.xid, e, ok, tc.known, tc.class, tc.remedy, tc.name)
		}
	}
}

// TestDefaultsAgainstTheLastRelease pins how the catalog's defaults differ
// from the fixed lists of the release before it, so that each change of
// class stays deliberate (CHANGELOG.md, docs/health.md).
func TestDefaultsAgainstTheLastRelease(t *testing.T) {
	oldIgnore := []uint64{13, 31, 43, 45, 68, 109}
	oldFatal := []uint64{48, 64, 74, 79, 92, 95, 119, 120}
	ignore, fatal := Default(Ignore), Default(Fatal)
	for _, x := range oldIgnore {
		if want := x != 109; slices.Contains(ignore, x) != want {
			t.Errorf("XID %d ignored: %v, want %v", x, !want, want)
		}
	}
	for _, x := range oldFatal {
		if want := x != 92; slices.Contains(fatal, x) != want {
			t.Errorf("XID %d fatal: %v, want %v", x, !want, want)
		}
	}
	// XID 109 asks for a reset, 92 for nothing; the lanes' XIDs keep their
	// meaning: 94 (the scale lane) comes and goes, 79 and 48 stay, 13 and
	// 31 are the application's.
	if !slices.Contains(fatal, 109) || !slices.Contains(ignore, 92) {
		t.Errorf("109 fatal %v, 92 ignored %v; want both", slices.Contains(fatal, 109), slices.Contains(ignore, 92))
	}
	if e, _ := Lookup(94); e.Health != Transient {
		t.Errorf("XID 94 is %s, want transient", e.Health)
	}
	newFatal := []uint64{46, 48, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158}
	if !slices.Equal(fatal, newFatal) {
		t.Errorf("fatal = %v, want %v", fatal, newFatal)
	}
}

func TestParseClass(t *testing.T) {
	for _, c := range Classes() {
		if got, err := ParseClass(string(c)); err != nil || got != c {
			t.Errorf("ParseClass(%q) = %q, %v", c, got, err)
		}
	}
	if _, err := ParseClass("Fatal"); err == nil {
		t.Error("ParseClass(Fatal) took a capital")
	}
}
