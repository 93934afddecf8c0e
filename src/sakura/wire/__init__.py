"""The wire: the content-addressed store and its manifest format, the HTTP server, the phone-side client."""
