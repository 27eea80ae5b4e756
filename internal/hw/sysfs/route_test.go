package sysfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

const routeHeader = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"

func TestDefaultRouteInterfaces(t *testing.T) {
	tests := []struct {
		name      string
		v4, v6    string // "-" leaves the file out
		want      []string
		wantErrIs error
	}{
		{
			name: "IPv4 default",
			v4:   routeHeader + "eno1\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\neno1\t0001A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n",
			v6:   "-",
			want: []string{"eno1"},
		},
		{
			name: "two default routes, one down",
			v4:   routeHeader + "eno1\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\neno2\t00000000\t0101A8C0\t0002\t0\t0\t200\t00000000\t0\t0\t0\n",
			v6:   "-",
			want: []string{"eno1"},
		},
		{
			name: "IPv6 default, lo unreachable ignored",
			v4:   routeHeader,
			v6: "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003 eno2\n" +
				"00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200 lo\n" +
				"20010db8000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 eno3\n",
			want: []string{"eno2"},
		},
		{
			name: "both families on one interface",
			v4:   routeHeader + "bond0\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n",
			v6:   "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003 bond0\n",
			want: []string{"bond0"},
		},
		{name: "no default route", v4: routeHeader + "eno1\t0001A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n", v6: "", want: nil},
		{name: "no route file", v4: "-", v6: "-", wantErrIs: fs.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			proc := t.TempDir()
			os.MkdirAll(filepath.Join(proc, "net"), 0o755)
			if tt.v4 != "-" {
				os.WriteFile(filepath.Join(proc, "net", "route"), []byte(tt.v4), 0o644)
			}
			if tt.v6 != "-" {
				os.WriteFile(filepath.Join(proc, "net", "ipv6_route"), []byte(tt.v6), 0o644)
			}
			got, err := DefaultRouteInterfaces(proc)
			if tt.wantErrIs != nil {
				if !errors.Is(err, tt.wantErrIs) {
					t.Fatalf("err = %v, want %v", err, tt.wantErrIs)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) == 0 && len(tt.want) == 0 {
				return
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("DefaultRouteInterfaces = %v, want %v", got, tt.want)
			}
		})
	}
}
