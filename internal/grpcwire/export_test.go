package grpcwire

// SetLimits sets a server's request limits, for tests.
func SetLimits(s *Server, maxRecv, maxBuffered int) { s.maxRecv, s.maxBuffered = maxRecv, maxBuffered }
