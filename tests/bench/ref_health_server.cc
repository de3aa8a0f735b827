// Reference server for the control-plane benchmark: grpc.health.v1.Health/Check on gRPC C++
// (Debian's libgrpc++) with default settings, answering SERVING; the synchronous API, or with
// --callback the callback (reactor) API. It listens in plaintext (h2c) and, given a
// certificate, also with TLS.
//   ref_health_server [--callback] H2C_PORT [TLS_PORT CERT KEY]
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <grpcpp/grpcpp.h>

#include "grpc/health/v1/health.grpc.pb.h"

namespace {

class Health final : public grpc::health::v1::Health::Service {
    grpc::Status Check(grpc::ServerContext *, const grpc::health::v1::HealthCheckRequest *,
                       grpc::health::v1::HealthCheckResponse *resp) override
    {
        resp->set_status(grpc::health::v1::HealthCheckResponse::SERVING);
        return grpc::Status::OK;
    }
};

class HealthCallback final : public grpc::health::v1::Health::CallbackService {
    grpc::ServerUnaryReactor *Check(grpc::CallbackServerContext *ctx,
                                    const grpc::health::v1::HealthCheckRequest *,
                                    grpc::health::v1::HealthCheckResponse *resp) override
    {
        resp->set_status(grpc::health::v1::HealthCheckResponse::SERVING);
        grpc::ServerUnaryReactor *r = ctx->DefaultReactor();
        r->Finish(grpc::Status::OK);
        return r;
    }
};

std::string slurp(const char *path)
{
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

} // namespace

int main(int argc, char **argv)
{
    bool callback = argc > 1 && std::string(argv[1]) == "--callback";
    if (callback) {
        argv++;
        argc--;
    }
    if (argc != 2 && argc != 5) {
        std::cerr << "usage: ref_health_server [--callback] H2C_PORT [TLS_PORT CERT KEY]\n";
        return 64;
    }
    Health sync_service;
    HealthCallback callback_service;
    grpc::ServerBuilder b;
    b.AddListeningPort(std::string("127.0.0.1:") + argv[1], grpc::InsecureServerCredentials());
    if (argc == 5) {
        grpc::SslServerCredentialsOptions tls;
        tls.pem_key_cert_pairs.push_back({slurp(argv[4]), slurp(argv[3])});
        b.AddListeningPort(std::string("127.0.0.1:") + argv[2], grpc::SslServerCredentials(tls));
    }
    if (callback)
        b.RegisterService(&callback_service);
    else
        b.RegisterService(&sync_service);
    std::unique_ptr<grpc::Server> server(b.BuildAndStart());
    if (!server)
        return 1;
    std::cout << "ready" << std::endl;
    server->Wait();
    return 0;
}
