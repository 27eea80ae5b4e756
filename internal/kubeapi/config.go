package kubeapi

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

// Config says how to reach and authenticate to the API server.
type Config struct {
	// Server is the API server's URL, such as https://10.0.0.1:6443.
	Server string
	// CAData is the PEM bundle the server's certificate must chain to;
	// empty: the system's roots.
	CAData []byte
	// Insecure skips verifying the server's certificate (kubeconfig
	// insecure-skip-tls-verify).
	Insecure bool
	// ServerName overrides the name the server's certificate is checked
	// against (kubeconfig tls-server-name).
	ServerName string

	// Token is a bearer token. TokenFile holds one and is re-read when it
	// changes (projected service-account tokens rotate); it wins over
	// Token, as in client-go.
	Token     string
	TokenFile string
	// CertData and KeyData are a PEM client certificate and key; CertFile
	// and KeyFile hold them and are re-read when they change (the
	// kubelet's client certificate rotates).
	CertData, KeyData []byte
	CertFile, KeyFile string
	// Username and Password are basic authentication.
	Username, Password string

	// UserAgent is sent with every request.
	UserAgent string
	// FieldManager names the writer in the object's managedFields, on
	// every write; empty leaves it to the API server (the user agent).
	FieldManager string
}

// kubeconfig is the part of a kubeconfig file this package reads.
type kubeconfig struct {
	CurrentContext string `json:"current-context"`
	Clusters       []struct {
		Name    string `json:"name"`
		Cluster struct {
			Server                   string `json:"server"`
			CertificateAuthority     string `json:"certificate-authority"`
			CertificateAuthorityData []byte `json:"certificate-authority-data"`
			InsecureSkipTLSVerify    bool   `json:"insecure-skip-tls-verify"`
			TLSServerName            string `json:"tls-server-name"`
			ProxyURL                 string `json:"proxy-url"`
		} `json:"cluster"`
	} `json:"clusters"`
	Contexts []struct {
		Name    string `json:"name"`
		Context struct {
			Cluster string `json:"cluster"`
			User    string `json:"user"`
		} `json:"context"`
	} `json:"contexts"`
	Users []struct {
		Name string `json:"name"`
		User struct {
			Token                 string `json:"token"`
			TokenFile             string `json:"tokenFile"`
			ClientCertificate     string `json:"client-certificate"`
			ClientCertificateData []byte `json:"client-certificate-data"`
			ClientKey             string `json:"client-key"`
			ClientKeyData         []byte `json:"client-key-data"`
			Username              string `json:"username"`
			Password              string `json:"password"`
			Exec                  any    `json:"exec"`
			AuthProvider          any    `json:"auth-provider"`
		} `json:"user"`
	} `json:"users"`
}

// LoadKubeconfig reads the current context of a kubeconfig file. File
// paths in it are relative to the file's directory, as kubectl reads
// them. Credential plugins (exec, auth-provider) are not supported: they
// would need their binaries in the plugin's image.
func LoadKubeconfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("reading kubeconfig: %w", err)
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(data, &kc); err != nil {
		return Config{}, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	ctxName := kc.CurrentContext
	if ctxName == "" && len(kc.Contexts) == 1 {
		ctxName = kc.Contexts[0].Name
	}
	if ctxName == "" {
		return Config{}, fmt.Errorf("kubeconfig %s: no current-context, and %d contexts to choose from", path, len(kc.Contexts))
	}
	i := index(len(kc.Contexts), func(i int) string { return kc.Contexts[i].Name }, ctxName)
	if i < 0 {
		return Config{}, fmt.Errorf("kubeconfig %s: current-context %q is not among its contexts", path, ctxName)
	}
	cx := kc.Contexts[i].Context
	ci := index(len(kc.Clusters), func(i int) string { return kc.Clusters[i].Name }, cx.Cluster)
	if ci < 0 {
		return Config{}, fmt.Errorf("kubeconfig %s: context %q names cluster %q, which it does not define", path, ctxName, cx.Cluster)
	}
	cl := kc.Clusters[ci].Cluster
	if cl.ProxyURL != "" {
		return Config{}, fmt.Errorf("kubeconfig %s: cluster %q: proxy-url is not supported", path, cx.Cluster)
	}
	c := Config{Server: cl.Server, Insecure: cl.InsecureSkipTLSVerify, ServerName: cl.TLSServerName, CAData: cl.CertificateAuthorityData}
	if len(c.CAData) == 0 && cl.CertificateAuthority != "" {
		if c.CAData, err = os.ReadFile(abs(cl.CertificateAuthority)); err != nil {
			return Config{}, fmt.Errorf("kubeconfig %s: cluster %q: certificate-authority: %w", path, cx.Cluster, err)
		}
	}
	if cx.User != "" {
		ui := index(len(kc.Users), func(i int) string { return kc.Users[i].Name }, cx.User)
		if ui < 0 {
			return Config{}, fmt.Errorf("kubeconfig %s: context %q names user %q, which it does not define", path, ctxName, cx.User)
		}
		u := kc.Users[ui].User
		if u.Exec != nil || u.AuthProvider != nil {
			return Config{}, fmt.Errorf("kubeconfig %s: user %q: credential plugins (exec, auth-provider) are not supported; use a token, token file or client certificate", path, cx.User)
		}
		c.Token, c.TokenFile = u.Token, abs(u.TokenFile)
		c.CertData, c.KeyData = u.ClientCertificateData, u.ClientKeyData
		if len(c.CertData) == 0 {
			c.CertFile = abs(u.ClientCertificate)
		}
		if len(c.KeyData) == 0 {
			c.KeyFile = abs(u.ClientKey)
		}
		c.Username, c.Password = u.Username, u.Password
	}
	if c.Server == "" {
		return Config{}, fmt.Errorf("kubeconfig %s: cluster %q has no server", path, cx.Cluster)
	}
	return c, nil
}

func index(n int, name func(int) string, want string) int {
	for i := range n {
		if name(i) == want {
			return i
		}
	}
	return -1
}

// ServiceAccountDir is where a pod's service-account credentials are
// mounted.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// InCluster is the configuration of a process in a pod: the API server
// from KUBERNETES_SERVICE_HOST and _PORT, the service account's token
// (re-read as it rotates) and CA from ServiceAccountDir.
func InCluster() (Config, error) { return InClusterFrom(os.Getenv, ServiceAccountDir) }

// InClusterFrom is InCluster reading the environment through getenv and
// the credentials from dir.
func InClusterFrom(getenv func(string) string, dir string) (Config, error) {
	host, port := getenv("KUBERNETES_SERVICE_HOST"), getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return Config{}, errors.New("not in a pod: KUBERNETES_SERVICE_HOST or KUBERNETES_SERVICE_PORT is unset; set a kubeconfig")
	}
	token := filepath.Join(dir, "token")
	// Read once now so a missing token fails at start, not at the first
	// event.
	if b, err := os.ReadFile(token); err != nil {
		return Config{}, fmt.Errorf("in-cluster service-account token: %w", err)
	} else if strings.TrimSpace(string(b)) == "" {
		return Config{}, fmt.Errorf("in-cluster service-account token %s is empty", token)
	}
	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return Config{}, fmt.Errorf("in-cluster CA: %w", err)
	}
	return Config{Server: "https://" + net.JoinHostPort(host, port), CAData: ca, TokenFile: token}, nil
}
