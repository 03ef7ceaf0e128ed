// HttpGet: the body of a plain HTTP/1.0 GET on loopback, for tests that
// scrape a daemon's /metrics. Deliberately minimal (no redirects, no
// chunking): the servers under test answer HTTP/1.0 with a full body.
#ifndef CONVEYOR_TESTS_TESTING_HTTP_GET_H_
#define CONVEYOR_TESTS_TESTING_HTTP_GET_H_

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace conveyor::testing {

// `address` is "host:port"; `path` starts with '/'. Fails on a connection
// error or a status other than 200.
inline absl::StatusOr<std::string> HttpGet(const std::string& address,
                                           const std::string& path) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("bad address ", address));
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 1 && host.front() == '[')
    host = host.substr(1, host.size() - 2);
  const std::string port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* info = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &info) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve ", address));
  }
  const int fd = socket(info->ai_family, info->ai_socktype, info->ai_protocol);
  const bool connected =
      fd >= 0 && connect(fd, info->ai_addr, info->ai_addrlen) == 0;
  freeaddrinfo(info);
  if (!connected) {
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to ", address));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", address, "\r\n\r\n");
  if (write(fd, request.data(), request.size()) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("short write");
  }
  std::string response;
  char buffer[65536];
  for (ssize_t n; (n = read(fd, buffer, sizeof buffer)) > 0;) {
    response.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || body == std::string::npos) {
    return absl::DataLossError(
        absl::StrCat("not an HTTP response from ", address));
  }
  if (response.find(" 200 ") > response.find("\r\n")) {
    return absl::FailedPreconditionError(absl::StrCat(
        address, path, ": ", response.substr(0, response.find("\r\n"))));
  }
  return response.substr(body + 4);
}

}  // namespace conveyor::testing

#endif  // CONVEYOR_TESTS_TESTING_HTTP_GET_H_
