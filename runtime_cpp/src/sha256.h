// SHA-256 (FIPS 180-4) of a file or a string, as lowercase hex: the manifest's checksums.
// Self-contained, so the runner links nothing beyond ExecuTorch (phones have no OpenSSL to share).
#pragma once

#include <string>

namespace hyflash {

std::string sha256_hex(const std::string& data);
std::string sha256_file(const std::string& path);  // throws std::runtime_error if unreadable

}  // namespace hyflash
